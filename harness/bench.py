"""`clawray bench WORKLOAD --conditions baseline,skills,full --seeds N`: does the loop help, measured.

Replays a MetaClaw-Bench-format workload (the project's own `workloads/clawray-mini`, or any folder in
that format; rounds whose fixtures the copy lacks are skipped and listed) day by day through the real
proxy with the harness's agent loop (harness/driver.py: `write_file`/`read_file` tools in a per-run
workspace), one simulated user, with a FRESH system per (condition, seed): its own storage root, Ray,
actors and vLLM, started in a child process (`python -m harness.bench --run ...`) so no state leaks
between runs. The conditions (MetaClaw's Table 1):

  baseline  no skills are injected and nothing learns (the bare model);
  skills    the fast loop only: at midday of every day the morning's failures are distilled into skills
            (`Evolver.evolve_now`, the feedback evolver; user scope), served from the afternoon on;
  full      skills as above, plus an RL window every evening (`Controller.train_step`: GRPO on Ray Train,
            hot-swapped), so the next day is served by the adapter. The window first re-samples GROUP_SIZE
            responses for each of the afternoon's query prompts through the engine (train/rollouts.py) and
            trains whole groups with group-relative advantages (MetaClaw's RL on real GRPO groups);
  batchnorm the same window on the afternoon's turns as served, batch-normalised (no groups): what the
            groups add.

Why a day is split at midday: MetaClaw trains only on samples served after the latest change of the skill
library (support/query separation), so an evolution at the end of the day would leave an evening window
nothing to train. Both `skills` and `full` evolve from the morning's failures only (the afternoon is the
query set in both), so the two differ by the RL windows alone; a round's feedback reaches the model with
the next round's question, so the last round of each half teaches nothing. Long-term memory and the collective job are off in every condition (they are not part
of this comparison). The seed sets the sampling seeds of the requests (harness/driver.py `request_seed`,
through the session names) and the LoRA's initialisation.

Per day and overall: accuracy (mean round score), completion (fraction of rounds fully correct), samples
stored, skills, adapters published; mean and 95% CI over the seeds (harness/bench_stats.py), the ordering
check, a PNG and a JSON under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import names
from core.config import REPO_ROOT, ClawrayConfig, config_from_dict

USER = "bench"
SETTLE_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Condition:
    skills: bool  # skills injected, and the fast loop distils failures at midday
    train: bool  # an RL window every evening
    groups: bool = False  # the window re-samples GRPO groups first (train/rollouts.py), else batch-normalised
    opd: bool = False  # the loss also distils a teacher (`--teacher`: a local model with the same tokenizer)


CONDITIONS = {"baseline": Condition(False, False), "skills": Condition(True, False),
              "full": Condition(True, True, groups=True), "batchnorm": Condition(True, True),
              "opd": Condition(True, True, groups=True, opd=True)}
OPD_WEIGHT = 0.5  # `opd`: train.opd_weight (the per-token reverse KL to the teacher in the advantages)
# `full`: the evening window re-samples GROUP_SIZE responses for each of the afternoon's fresh prompts
# through the engine and trains them with group-relative advantages (issue 18 item 3), vs `batchnorm`'s batch
# normalisation over the afternoon's turns as served. WINDOW_STEPS steps of WINDOW_BATCH samples per window.
GROUP_SIZE = 16
WINDOW_STEPS, WINDOW_BATCH = 8, 8


def parse_conditions(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CONDITIONS]
    if bad or not names:
        raise ValueError(f"unknown condition(s) {bad or text!r}; valid: {', '.join(CONDITIONS)}")
    return list(dict.fromkeys(names))


def bench_config(cfg: ClawrayConfig, condition: str, seed: int, root: Path, workspace_src: Path | None,
                 model: str | None = None) -> ClawrayConfig:
    """The demo's clock knobs (harness/demo.py `demo_config`), then the condition: no window opens by itself
    (`skills_only`: the harness opens the evening windows of `full` itself), lessons are the user's own,
    memory and the collective job off; skills injected only where the condition has them."""
    from harness.demo import demo_config

    data = demo_config(cfg, root, workspace_src).model_dump(mode="json")
    cond = CONDITIONS[condition]
    data["scheduler"]["mode"] = "skills_only"
    data["evolver"]["scope"] = "user"
    data["evolver"]["collective"]["enabled"] = False
    data["memory"]["enabled"] = False
    data["skills"]["enabled"] = cond.skills
    # An evening trains whatever the afternoon left fresh: a few turns, some masked (reward exactly 0).
    data["train"].update(seed=seed, min_fresh_samples=1, max_steps_per_window=WINDOW_STEPS, batch_size=WINDOW_BATCH)
    data["train"]["rollouts"]["group_size"] = GROUP_SIZE if cond.groups else 0
    if cond.opd:  # the teacher's endpoint is set by the run once its server is up (harness/teacher.py)
        data["train"]["opd_weight"] = OPD_WEIGHT
    if model is not None:  # e.g. `tiny-instruct` (scripts/make_instruct_model.py)
        data["model"]["path"] = model
    return config_from_dict(data, f"bench-{condition}")


def halves(rounds: list) -> tuple[list, list]:
    """Morning and afternoon of a day (the afternoon gets the extra round of an odd count)."""
    k = len(rounds) // 2
    return rounds[:k], rounds[k:]


# ------------------------------------------------------------------------------------ one run (child)
class Run:
    """One condition and seed on a fresh system (this process owns it from start to stop)."""

    def __init__(self, cfg: ClawrayConfig, condition: str, seed: int, workload):
        self.cfg, self.condition, self.seed, self.workload = cfg, condition, seed, workload
        self.cond = CONDITIONS[condition]
        self.root = cfg.storage_path()
        self.handles: dict[str, Any] = {}
        self.adapters: list[str] = []

    def _stats(self, name: str) -> dict[str, Any]:
        import ray

        return ray.get(self.handles[name].stats.remote())

    def _settle(self, sessions: list[str], replay0: int, observed0: int) -> None:
        """Until every main turn of `sessions` is stored in Replay and observed by the Evolver."""
        from harness.demo import session_turns

        n = len(session_turns(self.cfg, sessions))
        deadline = time.time() + SETTLE_TIMEOUT_S
        while time.time() < deadline:
            if (self._stats(names.REPLAY)["total"] - replay0 >= n
                    and self._stats(names.EVOLVER)["turns_observed"] - observed0 >= n):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{n} turns of {sessions} were not all scored within {SETTLE_TIMEOUT_S:.0f} s")

    def _play(self, base_url: str, day, rounds: list, part: str) -> list:
        from harness.driver import run_day
        from harness.workload import Day

        tag = f"-s{self.seed}-{part}"
        part_day = Day(day.id, day.desc, rounds, day.skipped)
        return asyncio.run(run_day(base_url, self.workload, part_day, [USER], self.root / "workspaces",
                                   model=self.cfg.model.policy_alias, run_tag=tag))

    def day(self, base_url: str, i: int, day) -> dict[str, Any]:
        import ray

        from harness.driver import prepare_workspace

        prepare_workspace(self.workload, self.root / "workspaces", USER)
        morning, afternoon = halves(day.rounds)
        replay0, observed0 = self._stats(names.REPLAY)["total"], self._stats(names.EVOLVER)["turns_observed"]
        results = self._play(base_url, day, morning, "am")
        am, pm = (f"{USER}-{day.id}-s{self.seed}-{part}" for part in ("am", "pm"))
        if self.cond.skills and morning:  # midday: the fast loop distils the morning's failures (only)
            self._settle([am], replay0, observed0)
            ray.get(self.handles[names.EVOLVER].evolve_now.remote(am))
            # The Proxy re-reads the library at most once per `skills.refresh_s`, on a request: without this
            # wait the afternoon's first round was served with the morning's library in some runs and the
            # midday skills in others (0.1 of day-1 accuracy between runs of one seed, docs/bench.md).
            # No request reaches the Proxy meanwhile, so its next one always re-reads.
            time.sleep(self.cfg.skills.refresh_s)
        results += self._play(base_url, day, afternoon, "pm")
        self._settle([am, pm], replay0, observed0)  # the whole day stored before the evening
        trained = None
        if self.cond.train and i < len(self.workload.days) - 1:  # evening: an RL window before the next day
            trained = ray.get(self.handles[names.CONTROLLER].train_step.remote(self.cfg.train.max_steps_per_window))
            self.adapters += list(trained.get("adapters") or [])
        n = len(results)
        return {"day": day.id, "rounds": n, "skipped": list(day.skipped),
                "accuracy": sum(r.score for r in results) / n if n else 0.0,
                "completion": sum(r.passed for r in results) / n if n else 0.0,
                "errors": sum(r.error is not None for r in results),
                "samples": self._stats(names.REPLAY)["total"], "skills": self._stats(names.EVOLVER)["skills"],
                "adapters": len(self.adapters),
                "window": None if trained is None else {k: trained.get(k) for k in
                                                       ("steps", "trained", "stop_reason", "error", "rollouts")}}

    def run(self, teacher: str | None = None) -> dict[str, Any]:
        from contextlib import nullcontext

        from cluster.system import start_system, stop_system
        from harness.teacher import free_port, serve_teacher

        t0 = time.time()
        if self.cond.opd and not teacher:
            raise ValueError("the opd condition needs --teacher MODEL (a local model with the policy's tokenizer)")
        path = self.cfg.model.model_copy(update={"path": teacher}).resolved_path(self.cfg.cache_path()) \
            if teacher else None
        served = (serve_teacher(path, free_port(), max_model_len=self.cfg.model.max_model_len,
                                log=self.root.parent / "teacher.log") if self.cond.opd else nullcontext())
        with served as endpoint:
            if endpoint is not None:
                self.cfg.rewards.teacher = endpoint
            try:
                system = start_system(self.cfg)
                self.handles = system.handles
                days = [self.day(system.base_url, i, d) for i, d in enumerate(self.workload.days)]
            finally:
                stop_system(self.cfg)
        return {"condition": self.condition, "seed": self.seed, "days": days, "seconds": time.time() - t0,
                "adapters": self.adapters}


def run_one(cfg: ClawrayConfig, workload_dir: Path, condition: str, seed: int, out: Path,
            rounds: int | None = None, model: str | None = None, teacher: str | None = None) -> dict[str, Any]:
    from cluster.runtime import runtime_env_vars
    from harness.workload import load_workload

    workload = load_workload(workload_dir)
    if rounds is not None:
        for d in workload.days:
            d.rounds = d.rounds[:rounds]
    root = out / f"{condition}-s{seed}"
    # A fresh system also means fresh state: an earlier bench into the same `out` left this run's sessions,
    # replay and skills behind, and a run on them counts the old turns as its own.
    shutil.rmtree(root, ignore_errors=True)
    cfg = bench_config(cfg, condition, seed, root / "state", workload.workspace_src, model)
    for k, v in runtime_env_vars(cfg).items():
        os.environ.setdefault(k, v)
    result = Run(cfg, condition, seed, workload).run(teacher)
    result["workload"], result["model"], result["teacher"] = workload.name, cfg.model.path, teacher
    (out / f"{condition}-s{seed}.json").write_text(json.dumps(result, indent=2))
    return result


# ------------------------------------------------------------------------------------ the bench (parent)
def run_bench(workload_dir: Path, conditions: list[str], seeds: int, out: Path, *, config: Path | None = None,
              rounds: int | None = None, model: str | None = None, console=None, seed0: int = 0,
              teacher: str | None = None) -> dict[str, Any]:
    """Every (condition, seed) in a child process of its own, then the summary, the ordering check, the
    PNG and `bench.json` under `out`. A run that fails is reported with its log and stops the bench."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from harness import bench_stats
    from harness.workload import load_workload

    if "opd" in conditions and not teacher:
        raise ValueError("the opd condition needs --teacher MODEL (a local model with the policy's tokenizer)")
    console = console or Console()
    workload = load_workload(workload_dir)
    out.mkdir(parents=True, exist_ok=True)
    skipped = {d.id: d.skipped for d in workload.days if d.skipped}
    runs = []
    plan = [(c, s) for s in range(seed0, seed0 + seeds) for c in conditions]
    cols = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console) as progress:
        task = progress.add_task(f"bench {workload.name}", total=len(plan))
        for cond, seed in plan:
            progress.update(task, description=f"bench {workload.name}: {cond}, seed {seed} (fresh system)")
            log = out / f"{cond}-s{seed}.log"
            argv = [sys.executable, "-m", "harness.bench", "--run", cond, "--seed", str(seed),
                    "--workload", str(workload_dir), "--out", str(out)]
            argv += ["--config", str(config)] if config else []
            argv += ["--rounds", str(rounds)] if rounds is not None else []
            argv += ["--model", model] if model is not None else []
            argv += ["--teacher", teacher] if teacher is not None else []
            with log.open("w") as f:
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                    timeout=RUN_TIMEOUT_S).returncode
            if rc != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                raise RuntimeError(f"bench run {cond} seed {seed} failed (exit {rc}); log {log}:\n{tail}")
            runs.append(json.loads((out / f"{cond}-s{seed}.json").read_text()))
            progress.advance(task)
    summary = bench_stats.summarize(runs)
    result = {"workload": workload.name, "workload_dir": str(workload_dir), "model": runs[0].get("model"),
              "teacher": teacher,
              "conditions": conditions,
              "seeds": list(range(seed0, seed0 + seeds)), "rounds_per_day": rounds, "skipped": skipped,
              "summary": summary, "ordering": bench_stats.ordering(summary, runs=runs), "runs": runs, "time": time.time()}
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    bench_stats.plot(summary, out / "bench.png", f"{workload.name} ({result['model']}): {seeds} seed(s)")
    print_result(result, console)
    return result


def print_result(result: dict[str, Any], console) -> None:
    from rich.table import Table

    def cell(m, ci) -> str:
        return f"{m:.3f}" + (f" ± {ci:.3f}" if ci is not None else "")

    t = Table(title=f"clawray bench: {result['workload']}, model {result['model']} "
                    f"(mean ± 95% CI over seeds {result['seeds']})")
    for col in ("condition", "accuracy", "completion", "skills (last day)", "adapters (last day)"):
        t.add_column(col)
    for cond, s in result["summary"].items():
        o, last = s["overall"], s["days"][-1]
        t.add_row(cond, cell(o["accuracy"], o["accuracy_ci"]), cell(o["completion"], o["completion_ci"]),
                  f"{last['skills']:.1f}", f"{last['adapters']:.1f}")
    console.print(t)
    for o in result["ordering"]:
        verdict = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "no CI (one seed)"}[o["holds"]]
        ci = f"{o['ci']:.3f}" if o["ci"] is not None else "-"
        unpaired = f" (unpaired {o['ci_unpaired']:.3f})" if o.get("ci_unpaired") is not None else ""
        console.print(f"{o['lower']} < {o['higher']}: gap {o['gap']:+.3f}, paired CI {ci}{unpaired}: {verdict}")
    for day, why in result["skipped"].items():
        console.print(f"skipped in {day}: {'; '.join(why)}")


def main(argv: list[str] | None = None) -> int:
    """The child process of one run (`--run CONDITION --seed N`)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, choices=sorted(CONDITIONS))
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--teacher", default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # before Ray is imported, as `clawray` runs it
    from core.config import load_config

    run_one(load_config(a.config), a.workload, a.run, a.seed, a.out, a.rounds, a.model, a.teacher)
    return 0


if __name__ == "__main__":
    sys.exit(main())
