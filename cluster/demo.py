"""`make demo` / `clawray demo`: a simulated workday through the whole loop on this machine.

local cluster in `auto` mode → day 1 (simulated users through the proxy) → skills distilled from the
feedback, generation bumps, stale samples retired → the users go quiet, OMLS's inactivity signal opens a
window → GRPO steps on Ray Train → adapter `policy-v0001…` hot-swapped into serving → day 2 → summary
table and report PNG → everything stopped.

The window is opened by OMLS itself (inactivity threshold set to seconds for the demo), never by
calling the Controller directly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

import ray
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.config import REPO_ROOT, ClawrayConfig, config_from_dict

DEFAULT_WORKLOAD = REPO_ROOT / "workloads" / "clawray-mini"
USERS = ["mei", "raj", "ana"]


def demo_config(cfg: ClawrayConfig) -> ClawrayConfig:
    """The embedded default with the clock-like knobs turned to seconds so a workday fits in minutes."""
    data = cfg.model_dump(mode="json")
    data["storage_root"] = str(REPO_ROOT / "state" / "demo")
    data["proxy"]["session_idle_timeout_s"] = 60
    data["scheduler"].update(mode="auto", sleep_start=None, sleep_end=None, idle_minutes=0.25,
                             min_window_minutes=0, poll_s=1)
    data["evolver"].update(every_n_turns=0, on_session_end=True, failure_rate_threshold=1.0)
    data["train"].update(min_fresh_samples=4, max_steps_per_window=3, batch_size=8)
    return config_from_dict(data, "demo")


def _wait(pred, timeout: float, every: float = 1.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    return None


class Demo:
    def __init__(self, cfg: ClawrayConfig, workload: Path, console: Console):
        from scripts.workload import load_workload

        self.cfg, self.console = cfg, console
        self.workload = load_workload(workload)
        self.root = cfg.storage_path()
        self.rows: list[dict[str, Any]] = []
        self.system = None

    # ---- observation helpers ----------------------------------------------------------------------

    def _h(self, name: str):
        return self.system.handles[name]

    def _health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.system.base_url + "/healthz", timeout=10).json()

    def _outbox_drained(self) -> bool:
        from serve.sessions import SessionStore

        store = SessionStore(self.root / "sessions" / "sessions.db")
        try:
            st = store.stats()
        finally:
            store.close()
        return st.get("pending", 0) == 0 and st.get("completed", 0) == 0

    # ---- phases -----------------------------------------------------------------------------------

    def play_day(self, day, progress: Progress) -> dict[str, Any]:
        from scripts.driver import prepare_workspace, run_day, summarize

        ws_root = self.root / "workspaces"
        for u in USERS:
            prepare_workspace(self.workload, ws_root, u)
        replay0 = ray.get(self._h("Replay").stats.remote())["by_state"]
        task = progress.add_task(f"{day.id}: {len(USERS)} users × {len(day.rounds)} rounds",
                                 total=len(USERS) * len(day.rounds))
        adapter = self._health().get("active_adapter")
        results = []
        # The first user starts the day alone and the team follows, as a new habit spreads: lessons the
        # first session teaches become skills (a new generation) before the others' turns are served, so
        # those turns are query samples of a stable generation rather than all retired at once.
        for group in (USERS[:1], USERS[1:]):
            results += asyncio.run(run_day(self.system.base_url, self.workload, day, group, ws_root,
                                           on_result=lambda r: progress.advance(task)))
            progress.update(task, description=f"{day.id}: scoring and distilling skills")
            _wait(self._outbox_drained, 120)
            time.sleep(3)  # the PRM hands each scored turn to the Evolver right after storing it
        skills = ray.get(self._h("Evolver").stats.remote())
        replay = ray.get(self._h("Replay").stats.remote())["by_state"]
        progress.update(task, description=f"{day.id}: done")
        s = summarize(results)
        return {"day": day.id, "mean_score": s["mean_score"], "passed": f"{s['passed']}/{s['rounds']}",
                "errors": s["errors"], "skills": skills["skills"], "generation": skills["generation"],
                "adapter": adapter or "base",
                "support": replay.get("support", 0) - replay0.get("support", 0),
                "retired": replay.get("retired", 0) - replay0.get("retired", 0),
                "fresh": replay.get("fresh", 0)}

    def idle_window(self, progress: Progress) -> dict[str, Any]:
        task = progress.add_task("users away: waiting for OMLS to open a window", total=None)
        ctl = self._h("Controller")
        runs0 = ray.get(ctl.status.remote())["runs"]
        started = _wait(lambda: ray.get(ctl.status.remote())["runs"] > runs0, 180)
        if not started:
            progress.update(task, description="no training window opened (see `clawray status`)")
            return {}
        progress.update(task, description="window open: GRPO on Ray Train")
        done = _wait(lambda: (st := ray.get(ctl.status.remote())) and not st["running"] and st["last_run"]
                     and st["last_run"].get("run") == st["runs"] and st["last_run"], 600, every=2)
        last = done or {}
        adapter = self._health().get("active_adapter")
        progress.update(task, description=f"window closed: {last.get('steps', 0)} step(s), "
                        f"{last.get('trained', 0)} samples trained, serving {adapter or 'base'}")
        progress.update(task, total=1, completed=1)
        return last

    def run(self) -> None:
        from cluster.report import write_report
        from cluster.system import start_system, stop_system

        if self.root.exists():
            shutil.rmtree(self.root)  # a demo starts from an empty storage root
        cols = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        try:
            with Progress(*cols, console=self.console) as progress:
                boot = progress.add_task("starting clawray (Ray, actors, vLLM on CPU)", total=None)
                self.system = start_system(self.cfg, progress=lambda m: progress.update(boot, description=m))
                progress.update(boot, description=f"clawray up at {self.system.base_url}", total=1, completed=1)
                for i, day in enumerate(self.workload.days):
                    row = self.play_day(day, progress)
                    if i < len(self.workload.days) - 1:
                        run = self.idle_window(progress)
                        row.update(trained=run.get("trained", 0), steps=run.get("steps", 0),
                                   new_adapters=", ".join(run.get("adapters") or []) or "-")
                    self.rows.append(row)
            self.print_summary()
            png = write_report(self.root, self.root / "report.png")
            self.console.print(f"report: {png}")
        finally:
            with self.console.status("stopping clawray"):
                stop_system(self.cfg)
        self.console.print("[green]demo finished; nothing left running[/]")

    def print_summary(self) -> None:
        t = Table(title="clawray demo: one simulated workday per row")
        cols = [("day", "day"), ("mean reward", "mean_score"), ("passed", "passed"), ("failed requests", "errors"),
                ("skills", "skills"),
                ("generation", "generation"), ("adapter served", "adapter"), ("support", "support"),
                ("retired", "retired"), ("trained after", "trained"), ("GRPO steps", "steps"),
                ("published", "new_adapters")]
        for name, _ in cols:
            t.add_column(name)
        for row in self.rows:
            t.add_row(*[f"{row[k]:.3f}" if isinstance(row.get(k), float) else str(row.get(k, "-")) for _, k in cols])
        self.console.print(t)


def run_demo(cfg: ClawrayConfig, workload: Path | None = None, console: Console | None = None) -> None:
    from cluster.runtime import runtime_env_vars

    cfg = demo_config(cfg)
    for k, v in runtime_env_vars(cfg).items():
        os.environ.setdefault(k, v)
    console = console or Console()
    if console.width < 140:  # the summary table has 12 columns; don't squash it in a pipe or CI log
        console = Console(width=140)
    Demo(cfg, workload or DEFAULT_WORKLOAD, console).run()
