"""The `clawray` command: the control plane's CLI (cluster/cli.py) plus the harness's own commands.

The harness sits above every plane (it drives the system as users would), so its commands are mounted
here and not in cluster/, which never imports upward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cluster import cli as control

app = control.app


@app.command()
def demo(config: control.ConfigOpt = None,
         workload: Annotated[Path | None, typer.Option(help="a MetaClaw-Bench-format folder")] = None,
         rounds: Annotated[int | None, typer.Option(help="play only the first N rounds of each day")] = None,
         state: Annotated[Path | None, typer.Option(help="storage root (default state/demo)")] = None,
         model: Annotated[str | None, typer.Option(help="model.path for the run (default: tiny-instruct where the "
                                                        "config names the embedded tiny model)")] = None) -> None:
    """Simulated workdays through the whole loop on this machine (the `make demo` job); exits non-zero
    naming the first promised stage that did not happen."""
    from harness.demo import run_demo
    from harness.stages import first_failure

    verdicts = run_demo(control._cfg(config), workload=workload, console=control.console, rounds=rounds,
                        storage_root=state, model=model)
    if first_failure(verdicts) is not None:
        raise typer.Exit(1)


@app.command()
def bench(workload: Annotated[Path | None, typer.Argument(help="a MetaClaw-Bench-format folder "
                                                             "(default: workloads/clawray-mini)")] = None,
          conditions: Annotated[str, typer.Option(help="comma-separated: baseline, skills, full (re-sampled "
                                                       "GRPO groups), batchnorm, opd (needs --teacher)")]
          = "baseline,skills,full",
          seeds: Annotated[int, typer.Option(min=1, help="seeds per condition (0 .. N-1)")] = 3,
          rounds: Annotated[int | None, typer.Option(min=1, help="play only the first N rounds of each day")] = None,
          out: Annotated[Path | None, typer.Option(help="results folder (default state/bench/<workload>)")] = None,
          model: Annotated[str | None, typer.Option(help="model.path for every run, e.g. tiny-instruct "
                                                         "(make instruct-model)")] = None,
          teacher: Annotated[str | None, typer.Option(help="the opd condition's teacher: a local model with the "
                                                           "policy's tokenizer, e.g. tiny-instruct")] = None,
          config: control.ConfigOpt = None) -> None:
    """Replay a workload day by day per condition and seed, each on a fresh system; accuracy and completion
    per day and overall with 95% CIs, the ordering check, bench.json and bench.png (harness/bench.py)."""
    from harness.bench import parse_conditions, run_bench
    from harness.demo import DEFAULT_WORKLOAD

    try:
        conds = parse_conditions(conditions)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--conditions") from e
    if "opd" in conds and not teacher:
        raise typer.BadParameter("the opd condition distils a teacher: name it with --teacher MODEL",
                                 param_hint="--teacher")
    workload = (workload or DEFAULT_WORKLOAD).resolve()
    if not (workload / "all_tests.json").is_file():
        raise typer.BadParameter(f"{workload} has no all_tests.json (not a MetaClaw-Bench-format folder)",
                                 param_hint="WORKLOAD")
    out = (out or Path("state") / "bench" / workload.name).resolve()
    run_bench(workload, conds, seeds, out, config=config, rounds=rounds, model=model, console=control.console,
              teacher=teacher)


def main() -> None:
    control.main()


if __name__ == "__main__":
    main()
