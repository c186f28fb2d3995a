"""`make demo` / `clawray demo`: simulated workdays through the whole loop on this machine, self-checked.

Each day of the workload is played by a small team through the real proxy:
  morning    the first user (the pilot) works alone; the PRM scores every turn, the Evolver buffers them;
  midday     the fast loop distils the morning's failures into skills (`Evolver.evolve_now`, the
             actor's manual trigger): a new skill generation; the failures become the support
             set and older samples retire;
  afternoon  the rest of the team works under the new skills: their turns are the QUERY set;
  evening    the users go quiet; OMLS's inactivity signal opens a window by itself; the Controller runs
             GRPO on Ray Train over the fresh query samples; each step publishes `policy-vNNNN` and
             hot-swaps it into serving;
  night      the collective job looks at every user's sessions of the day, decides per skill group and
             replays its candidates through the engine behind the validation gate (docs/collective.md);
and the next day is served by that adapter and the grown library.

Why evolution happens at midday and not at every session end: MetaClaw trains only on samples served
after the latest change of S. With an evolution per session end, each of a team's concurrent sessions
retires the others' samples and a window finds nothing to train (what the first version of this demo
did). One evolution per day, between the pilot and the team, keeps the paper's rules (support never
trained, stale generations retired) and leaves the afternoon's turns for the slow loop.

Every promised stage is checked (harness/stages.py); the demo exits non-zero naming the first stage that
did not happen. The evidence and verdicts are written to `<storage root>/demo-stages.json`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from core import names
from core.config import REPO_ROOT, ClawrayConfig, config_from_dict
from core.storage import StorageLayout
from harness.stages import Evidence, Verdict, evaluate, first_failure

DEFAULT_WORKLOAD = REPO_ROOT / "workloads" / "clawray-mini"
USERS = ["mei", "raj", "ana"]  # mei is the pilot; raj and ana follow after the midday evolution
SETTLE_TIMEOUT_S = 180.0
WINDOW_TIMEOUT_S = 240.0


def demo_config(cfg: ClawrayConfig, storage_root: Path | None = None, workspace_src: Path | None = None) -> ClawrayConfig:
    """The embedded default with the clock-like knobs turned to seconds so a workday fits in minutes.

    Evolution triggers are off: the demo evolves once per day at midday (module docstring). The
    inactivity threshold (30 s) is well above the pause between morning and afternoon, so a window
    opens only when the users have gone home.
    """
    data = cfg.model_dump(mode="json")
    data["storage_root"] = str(storage_root or REPO_ROOT / "state" / "demo")
    data["proxy"]["session_idle_timeout_s"] = 60
    data["scheduler"].update(mode="auto", sleep_start=None, sleep_end=None, idle_minutes=0.5,
                             min_window_minutes=0, poll_s=1)
    data["evolver"].update(every_n_turns=0, on_session_end=False, failure_rate_threshold=1.0, scope="group")
    # The simulated users are one team (a skill group): the pilot's lessons are served to the whole team,
    # and to no one else (evolve/scopes.py).
    data["skills"]["groups"] = {**data["skills"].get("groups", {}), "team": list(USERS)}
    data["evolver"]["collective"]["gate"]["max_tokens"] = 24  # the demo's replies are 24 tokens (driver.py)
    # The gate replays file tasks with the users' tools in a copy of the workload's workspace (evolve/sandbox.py).
    # A file task is replayed from the user's files as they were when it started (harness/driver.py keeps a
    # snapshot per task under the workspaces folder); the workload's own copy is the fallback.
    root = Path(data["storage_root"])
    data["evolver"]["collective"]["gate"]["sandbox"] = {
        "tools": "harness.tools:WORKSPACE_TOOLS", "workspace_src": str(workspace_src) if workspace_src else None,
        "snapshot_root": str(root / "workspaces")}
    # The evening window re-samples GRPO groups for the day's query prompts while the engine is idle
    # (train/rollouts.py): whole groups with group-relative advantages, as `clawray bench`'s full condition.
    data["train"].update(min_fresh_samples=4, max_steps_per_window=6, batch_size=16)
    data["train"]["rollouts"].update(group_size=8, max_prompts=8, max_tokens=24)
    return config_from_dict(data, "demo")


def session_turns(cfg: ClawrayConfig, sessions: list[str]) -> list:
    """The recorded turns of `sessions`, read from the session store of `cfg`'s storage root."""
    from serve.sessions import SessionStore

    store = SessionStore(cfg.storage_path() / "sessions" / "sessions.db", cfg.state)
    try:
        return [t for s in sessions for t in store.turns(s)]
    finally:
        store.close()


def _wait(pred, timeout: float, every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    return None



@contextmanager
def users_at_work(omls, every_s: float = 2.0):
    """The simulated users are at their desks for the whole working day, also while the demo waits for the
    morning's turns to be scored and distilled (on 2 loaded cores that pause can outlast OMLS's 30-second
    inactivity threshold, and a window opened at midday would train the morning's generation). Reported
    through OMLS's activity input, as the Proxy reports a request. The evening starts when this ends."""
    done = threading.Event()

    def beat():
        while not done.is_set():
            omls.report_activity.remote(time.time())
            done.wait(every_s)

    thread = threading.Thread(target=beat, name="users-at-work", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()

class Demo:
    def __init__(self, cfg: ClawrayConfig, workload: Path, console: Console, rounds: int | None = None):
        from harness.workload import load_workload

        self.cfg, self.console = cfg, console
        self.workload = load_workload(workload)
        if rounds is not None:  # a shortened run (tests): the first `rounds` rounds of every day
            for day in self.workload.days:
                day.rounds = day.rounds[:rounds]
        self.root = cfg.storage_path()
        self.rows: list[dict[str, Any]] = []
        self.ev = Evidence(min_fresh_samples=cfg.train.min_fresh_samples)
        self.system = None
        self.support_ids: set[str] = set()
        self.runs_before_evening, self.evening_at = 0, time.time()  # set again when the users go home
        self.memory_md = "## Memory\n\nNot collected: the run stopped before the end of the last day.\n"
        self.published_from: dict[str, int] = {}  # the night's collective publishes: name -> version before
        self.by_user: dict[str, dict[str, float | None]] = {}  # user -> day -> mean reward

    # ---- observation ------------------------------------------------------------------------------

    def _h(self, name: str):
        return self.system.handles[name]

    def _replay(self) -> dict[str, Any]:
        return ray.get(self._h(names.REPLAY).stats.remote())

    def _evolver(self) -> dict[str, Any]:
        return ray.get(self._h(names.EVOLVER).stats.remote())

    def _active_adapter(self) -> str | None:
        import httpx

        return httpx.get(self.system.base_url + "/healthz", timeout=10).json().get("active_adapter")

    def _replay_rows(self, where: str, args: tuple = ()) -> dict[str, tuple[str, int]]:
        """sample_id -> (state, generation), read straight from the Replay actor's database (SQLite WAL or
        PostgreSQL: a concurrent reader): the audit view, independent of what the actors report."""
        from train.replay import DB_FILE
        from train.replay_schema import open_replay_db

        db = open_replay_db(self.root / "replay" / DB_FILE, self.cfg.state)
        try:
            with db.tx() as c:
                rows = c.execute(f"SELECT sample_id, state, generation FROM samples WHERE {where}", args).fetchall()
        finally:
            db.close()
        return {sid: (state, gen) for sid, state, gen in rows}

    def _turns(self, sessions: list[str]) -> list:
        return session_turns(self.cfg, sessions)

    def _settle(self, sessions: list[str], replay0: int, observed0: int) -> tuple[int, int, int]:
        """Wait until every main turn of `sessions` is scored into Replay and observed by the Evolver.
        Returns (turns, samples stored since replay0, turns observed since observed0)."""
        n = len(self._turns(sessions))

        def done():
            stored = self._replay()["total"] - replay0
            observed = self._evolver()["turns_observed"] - observed0
            return (stored, observed) if stored >= n and observed >= n else None

        got = _wait(done, SETTLE_TIMEOUT_S)
        if got is None:
            return n, self._replay()["total"] - replay0, self._evolver()["turns_observed"] - observed0
        return n, *got

    # ---- phases -----------------------------------------------------------------------------------

    def _play(self, day, users: list[str], progress: Progress, task) -> list:
        from harness.driver import run_day

        return asyncio.run(run_day(self.system.base_url, self.workload, day, users, self.root / "workspaces",
                                   on_result=lambda r: progress.advance(task)))

    def play_day(self, i: int, day, progress: Progress) -> dict[str, Any]:
        from harness.driver import prepare_workspace, summarize

        for u in USERS:
            prepare_workspace(self.workload, self.root / "workspaces", u)
        task = progress.add_task(f"{day.id} morning: {USERS[0]} alone", total=len(USERS) * len(day.rounds))
        with users_at_work(self._h(names.OMLS)):
            results, turns, scored, observed, skills, replay = self._working_day(i, day, progress, task)
        # The evening: everyone has gone home; a window may open from here on (idle_window counts from here).
        self.runs_before_evening = ray.get(self._h(names.CONTROLLER).status.remote())["runs"]
        self.evening_at = time.time()
        team = [f"{u}-{day.id}" for u in USERS[1:]]
        t2, s2, o2 = self._settle(team, replay["total"], self._evolver_observed_at_afternoon)
        if i == 0:
            self.ev.day1_turns, self.ev.day1_scored, self.ev.day1_observed = turns + t2, scored + s2, observed + o2
        replay = self._replay()
        progress.update(task, description=f"{day.id}: done")
        s = summarize(results)
        for u in USERS:  # per user and day: the multi-user view of the report
            mine = [r.score for r in results if r.user == u]
            self.by_user.setdefault(u, {})[day.id] = sum(mine) / len(mine) if mine else None
        return {"day": day.id, "mean_score": s["mean_score"], "passed": f"{s['passed']}/{s['rounds']}",
                "errors": s["errors"], "skills": skills["skills"], "generation": skills["generation"],
                "adapter": self._day_adapters(day.id), "support": replay["by_state"].get("support", 0),
                "retired": replay["by_state"].get("retired", 0), "fresh": replay["trainable"]}

    def _working_day(self, i: int, day, progress: Progress, task):
        """Morning (one user), midday (scoring, then evolution), afternoon (the others)."""
        replay0, observed0 = self._replay()["total"], self._evolver()["turns_observed"]
        results = self._play(day, USERS[:1], progress, task)
        progress.update(task, description=f"{day.id} midday: scoring, then distilling the morning's failures")
        turns, scored, observed = self._settle([f"{USERS[0]}-{day.id}"], replay0, observed0)
        gen0 = self._evolver()["generation"]
        support0 = self._replay()["by_state"].get("support", 0)
        ray.get(self._h(names.EVOLVER).evolve_now.remote())
        skills = self._evolver()
        replay = self._replay()
        if i == 0:
            self.support_ids = set(self._replay_rows("state = 'support'"))
            self.ev.generation_before, self.ev.generation_after = gen0, skills["generation"]
            self.ev.skills_after = skills["skills"]
            self.ev.support = replay["by_state"].get("support", 0) - support0
        progress.update(task, description=f"{day.id} afternoon: {', '.join(USERS[1:])} under generation "
                        f"{skills['generation']}")
        self._evolver_observed_at_afternoon = self._evolver()["turns_observed"]
        results += self._play(day, USERS[1:], progress, task)
        return results, turns, scored, observed, skills, replay

    def _day_adapters(self, day_id: str) -> str:
        adapters = {t.adapter_version or "base" for t in self._turns([f"{u}-{day_id}" for u in USERS])}
        return ", ".join(sorted(adapters)) or "-"

    def idle_window(self, progress: Progress) -> dict[str, Any]:
        self.ev.fresh_before_window = self._replay()["trainable"]
        task = progress.add_task("users away: waiting for OMLS to open a window", total=None)
        ctl = self._h(names.CONTROLLER)
        runs0 = self.runs_before_evening  # a window may already have opened while the last turns were scored
        opened = _wait(lambda: ray.get(ctl.status.remote())["runs"] > runs0, WINDOW_TIMEOUT_S, every=1)
        self.ev.window_opened = bool(opened)
        if not opened:
            self._record_evening()
            progress.update(task, description="no training window opened (see `clawray status`)")
            return {}
        progress.update(task, description="window open: GRPO on Ray Train")
        last = _wait(lambda: (st := ray.get(ctl.status.remote())) and not st["running"] and st["last_run"]
                     and st["last_run"].get("run") == st["runs"] and st["last_run"], 600, every=2) or {}
        self._record_run(last)
        progress.update(task, description=f"window closed: {last.get('steps', 0)} step(s), "
                        f"{last.get('trained', 0)} samples trained, serving {self.ev.active_after_window or 'base'}")
        progress.update(task, total=1, completed=1)
        return last

    def _record_evening(self) -> None:
        """The Controller's events since the users left and OMLS's state now: the evidence of a window."""
        events = ray.get(self._h(names.CONTROLLER).history_events.remote())
        omls = ray.get(self._h(names.OMLS).state.remote())
        since = self.evening_at - 1
        self.ev.evening = [
            f"+{h['at'] - self.evening_at:.0f}s {h['event']}"
            + "".join(f" {k}={h[k]}" for k in ("state", "reason", "steps", "stop_reason", "error") if h.get(k))
            for h in events if h.get("at", 0) >= since][-12:]
        self.ev.evening.append(f"OMLS now {omls.get('state')}, last activity {omls.get('last_activity')}")

    def _record_run(self, last: dict[str, Any]) -> None:
        from train.run_files import step_log_path

        self.ev.steps, self.ev.run_error = int(last.get("steps") or 0), last.get("error")
        self.ev.run_stop_reason = last.get("stop_reason") or ("still running" if not last else None)
        self._record_evening()
        self.ev.adapters = list(last.get("adapters") or [])
        self.ev.active_after_window = self._active_adapter()
        path = step_log_path(StorageLayout(self.root), "grpo")
        steps = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        trained = [sid for s in steps for sid in s["sample_ids"]]
        self.ev.trained_ids = trained
        # The separation invariant on what was actually trained: no sample of the midday support set, and
        # only samples served under the generation that was current when the window trained.
        marks = ",".join("?" * len(trained))
        rows = self._replay_rows(f"sample_id IN ({marks})", tuple(trained)) if trained else {}
        current = self._evolver()["generation"]
        self.ev.trained_violations = [sid for sid in trained if sid in self.support_ids
                                      or rows.get(sid, ("?", -1)) != ("trained", current)]

    # ---- the run ----------------------------------------------------------------------------------

    def run(self) -> list[Verdict]:
        from cluster.report import write_report
        from cluster.system import start_system, stop_system
        from harness.plots import plot_on_off

        if self.root.exists():
            shutil.rmtree(self.root)  # a demo starts from an empty storage root
        cols = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        try:
            with Progress(*cols, console=self.console) as progress:
                boot = progress.add_task("starting clawray (Ray, actors, vLLM on CPU)", total=None)
                self.system = start_system(self.cfg, progress=lambda m: progress.update(boot, description=m))
                self.ev.serving = True
                progress.update(boot, description=f"clawray up at {self.system.base_url}", total=1, completed=1)
                for i, day in enumerate(self.workload.days):
                    row = self.play_day(i, day, progress)
                    if i == 0 and len(self.workload.days) > 1:
                        run = self.idle_window(progress)
                        adapters = run.get("adapters") or []
                        row.update(trained=run.get("trained", 0), steps=run.get("steps", 0),
                                   new_adapters=f"{len(adapters)}, last {adapters[-1]}" if adapters else "-")
                        self.collective(progress, [f"{u}-{day.id}" for u in USERS])
                    if i == 1:
                        self.ev.day2_adapters = [t.adapter_version for t in
                                                 self._turns([f"{u}-{day.id}" for u in USERS])]
                        self.on_off(progress, day.id)
                    self.rows.append(row)
                self.remember(progress)
            self.print_summary()
            self.console.print(Markdown(self.memory_md))
            self.console.print(f"report: {write_report(self.root, self.root / 'report.png', self.cfg.state)}")
            if self.ev.collective_on_off:
                png = plot_on_off(self.ev.collective_on_off, self.root / "collective.png", list(self.published_from))
                self.console.print(f"collective on vs off: {png}")
        finally:
            with self.console.status("stopping clawray"):
                stop_system(self.cfg)
        return self.verdicts()

    def collective(self, progress: Progress, sessions: list[str]) -> None:
        """Night: the collective job over every user's sessions of the day (docs/collective.md): groups by
        skill, decisions, the validation gate's replays through the engine (stage `collective`)."""
        task = progress.add_task("night: collective evolution over every user's sessions (validation gate)",
                                 total=None)
        report = ray.get(self._h(names.EVOLVER).collective_run.remote())
        self.ev.collective_sessions = sorted(set(sessions) & set(report.get("session_ids", [])))
        self.ev.collective_groups = report["groups"]
        self.ev.collective_decisions = [f"{d['group']}: {d['action']} -> {d['outcome'][:90]}"
                                        for d in report["decisions"]]
        self.ev.collective_published = list(report["published"])
        self.published_from = dict(report.get("published_from") or {})
        progress.update(task, description=f"night: {report['groups']} group(s) decided, "
                        f"{len(report['published'])} published", total=1, completed=1)

    def on_off(self, progress: Progress, day_id: str) -> None:
        """Day 2 with the collective loop on and off, per user: the night's publishes as served vs undone,
        each day-2 task replayed A/B through the engine and graded (evolve/impact.py). With nothing
        published, day 2 was served the very library it would have had with the loop off."""
        first = self.workload.days[0].id
        rows = {u: {"day01": self.by_user.get(u, {}).get(first), "day02": self.by_user.get(u, {}).get(day_id),
                    "day02_on": None, "day02_off": None} for u in USERS}
        if self.published_from:
            task = progress.add_task("collective on vs off: replaying day 2's tasks A/B", total=None)
            got = ray.get(self._h(names.EVOLVER).collective_impact.remote(
                [f"{u}-{day_id}" for u in USERS], self.published_from))
            for tenant, m in got["by_tenant"].items():
                user = tenant.split("/", 1)[0]
                if user in rows:
                    rows[user].update(day02_on=m["on"], day02_off=m["off"])
            progress.update(task, description=f"collective on vs off: {len(got['tasks'])} task(s) replayed",
                            total=1, completed=1)
        else:
            for r in rows.values():
                r.update(day02_on=r["day02"], day02_off=r["day02"])
        self.ev.collective_on_off = rows

    def remember(self, progress: Progress) -> None:
        """What long-term memory kept of each user (stage `memory`), once ingestion caught up with the
        ended sessions; the Markdown goes to the console and `memory.md` beside the report."""
        from memory.report import render_markdown, summary

        task = progress.add_task("memory: waiting for the Memory actor to ingest the sessions", total=None)
        self.ev.users = list(USERS)

        def remembered() -> dict[str, Any] | None:
            data = summary(self.root, state=self.cfg.state)
            return data if all(u in data["users"] and data["users"][u]["units"] > 0 for u in USERS) else None

        data = _wait(remembered, 120, every=2) or summary(self.root, state=self.cfg.state)
        self.ev.memory_by_user = {u: row["units"] for u, row in data["users"].items()}
        self.memory_md = render_markdown(data)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "memory.md").write_text(self.memory_md)
        progress.update(task, description=f"memory: {data['totals'].get('units', 0)} unit(s) remembered",
                        total=1, completed=1)

    def verdicts(self) -> list[Verdict]:
        verdicts = evaluate(self.ev)
        out = {"evidence": self.ev.as_dict(), "stages": [v.__dict__ for v in verdicts]}
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "demo-stages.json").write_text(json.dumps(out, indent=2))
        t = Table(title="what the demo promised")
        for col in ("stage", "happened", "evidence"):
            t.add_column(col)
        for v in verdicts:
            t.add_row(v.stage, "[green]yes[/]" if v.passed else "[red]NO[/]", escape(v.detail))
        self.console.print(t)
        return verdicts

    def print_summary(self) -> None:
        t = Table(title="clawray demo: one simulated workday per row")
        cols = [("day", "day"), ("mean reward", "mean_score"), ("passed", "passed"), ("failed requests", "errors"),
                ("skills", "skills"), ("generation", "generation"), ("adapter served", "adapter"),
                ("support", "support"), ("retired", "retired"), ("trained after", "trained"),
                ("GRPO steps", "steps"), ("published", "new_adapters")]
        for name, _ in cols:
            t.add_column(name)
        for row in self.rows:
            t.add_row(*[f"{row[k]:.3f}" if isinstance(row.get(k), float) else str(row.get(k, "-")) for _, k in cols])
        self.console.print(t)
        u = Table(title="reward per user and day")
        u.add_column("user")
        days = [r["day"] for r in self.rows]
        for d in days:
            u.add_column(d)
        for user, by_day in self.by_user.items():
            u.add_row(user, *[f"{by_day[d]:.3f}" if by_day.get(d) is not None else "-" for d in days])
        self.console.print(u)
        if self.ev.collective_decisions:
            self.console.print("collective job (night 1): " + "; ".join(self.ev.collective_decisions[:8]))
        self.print_on_off()

    def print_on_off(self) -> None:
        if not self.ev.collective_on_off:
            return
        t = Table(title="collective loop on vs off, per user (mean reward)")
        for col in ("user", "day 1 (before any collective run)", "day 2 served (loop on)",
                    "day 2 replayed: on", "day 2 replayed: off"):
            t.add_column(col)

        def f(x) -> str:
            return f"{x:.3f}" if x is not None else "-"

        for user, r in self.ev.collective_on_off.items():
            replayed = (f(r["day02_on"]), f(r["day02_off"])) if self.published_from else ("= served", "= served")
            t.add_row(user, f(r["day01"]), f(r["day02"]), *replayed)
        self.console.print(t)
        if self.published_from:
            self.console.print(f"night 1 published {', '.join(self.published_from)}: day 2's tasks replayed through "
                               "the engine with those skills as served (on) and with the night undone (off)")
        else:
            self.console.print("night 1 published nothing (every candidate was rejected by the validation gate): "
                               "with the loop off day 2 is served the same library, so on = off = served")


# The embedded default's random tiny model cannot read a skill, so a demo on it could only show the loop's
# mechanics; the instruction-following one (scripts/make_instruct_model.py, `make instruct-model`) reads
# the casing rule a skill states, so the day-2 improvement it prints is the skills' doing (docs/bench.md).
DEMO_MODEL = "tiny-instruct"


def run_demo(cfg: ClawrayConfig, workload: Path | None = None, console: Console | None = None, *,
             rounds: int | None = None, storage_root: Path | None = None, model: str | None = None) -> list[Verdict]:
    """Run the demo; returns the stage verdicts (the CLI exits non-zero on the first failed one). `model`:
    `model.path` for the run (default: the instruction-following tiny model where the config names the
    embedded `tiny` one; any other configured model is kept)."""
    from cluster.runtime import runtime_env_vars
    from harness.workload import load_workload

    workload = workload or DEFAULT_WORKLOAD
    model = model or (DEMO_MODEL if cfg.model.path == "tiny" else None)
    if model is not None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": model})})
        if not Path(cfg.model_path()).is_dir():
            raise FileNotFoundError(f"model {model!r} is not built at {cfg.model_path()} "
                                    f"(`make instruct-model` builds tiny-instruct)")
    cfg = demo_config(cfg, storage_root, load_workload(workload).workspace_src)
    for k, v in runtime_env_vars(cfg).items():
        os.environ.setdefault(k, v)
    console = console or Console()
    if console.width < 160:  # the summary table has 12 columns; don't squash it in a pipe or CI log
        console = Console(width=160)
    verdicts = Demo(cfg, workload, console, rounds).run()
    failed = first_failure(verdicts)
    if failed is None:
        console.print("[green]demo finished: every stage happened; nothing left running[/]")
    else:
        console.print(f"[red]demo failed: stage '{failed.stage}' did not happen[/] ({escape(failed.promise)}): "
                      f"{escape(failed.detail)}")  # as written: an error's text may hold "[...]"
    return verdicts
