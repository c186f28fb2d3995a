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
         state: Annotated[Path | None, typer.Option(help="storage root (default state/demo)")] = None) -> None:
    """Simulated workdays through the whole loop on this machine (the `make demo` job); exits non-zero
    naming the first promised stage that did not happen."""
    from harness.demo import run_demo
    from harness.stages import first_failure

    verdicts = run_demo(control._cfg(config), workload=workload, console=control.console, rounds=rounds,
                        storage_root=state)
    if first_failure(verdicts) is not None:
        raise typer.Exit(1)


def main() -> None:
    control.main()


if __name__ == "__main__":
    main()
