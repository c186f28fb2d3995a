"""Invariant: the control plane never wedges (issue 12 item 2).

Whatever happens to a training run (a window opens while a manual or `rl` run is going, the Controller
dies between saving its state and telling OMLS, a run crashes, OMLS is unreachable when a run ends), the
Controller's ticks bring OMLS back to a state from which the next window opens, and OMLS never says
UPDATING or PAUSING while no training run exists.

Deterministic: the tests drive `ControllerActor.tick()` by hand (no control loop, no Ray), against the
real OMLS state machine behind a fake actor handle, with the `TrainJob` replaced by a fake the test
finishes, crashes or kills at a chosen point. A Controller "killed" at a chosen point is a hook that
raises `Killed` (a BaseException, so no handler of the Controller swallows it) at that call; its restart
is a new `ControllerActor` built on the same persisted state, which is all a restarted actor has. Every
test runs on both state backends (`state_cfg`: the SQLite files under the storage root, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cluster.controller import ControllerActor
from cluster.omls import OMLS, State

REPO = Path(__file__).resolve().parents[2]


class Killed(BaseException):  # noqa: N818 - it is not an error: the process is gone
    """The Controller's process dies at this call."""


class Unavailable(Exception):  # noqa: N818 - stands for ray.exceptions.ActorUnavailableError
    """The actor is restarting: this call fails."""


class FakeOMLS:
    """`OMLSActor`'s interface over the real state machine (no signals: windows open by `trigger_now`).
    `fail_next[method] = exc` makes the next call of `method` raise before it reaches the machine."""

    def __init__(self) -> None:
        self.machine = OMLS([], lambda: datetime(2025, 3, 5, 12, 0, tzinfo=UTC))
        self.actions: list[dict[str, Any]] = []
        self.fail_next: dict[str, BaseException] = {}

    def _apply(self, method: str, transitions) -> list[dict[str, Any]]:
        out = [t.to_dict() for t in transitions]
        self.actions += [t for t in out if t["action"]]
        return out

    def _hook(self, method: str) -> None:
        exc = self.fail_next.pop(method, None)
        if exc is not None:
            raise exc

    async def trigger_now(self):
        return self._apply("trigger_now", self.machine.trigger_now())

    async def cancel_trigger(self):
        return self._apply("cancel_trigger", self.machine.cancel_trigger())

    async def training_started(self):
        self._hook("training_started")
        return self._apply("training_started", self.machine.training_started())

    async def training_stopped(self):
        self._hook("training_stopped")
        return self._apply("training_stopped", self.machine.training_stopped())

    async def report_activity(self, ts):  # no inactivity signal here: windows open by `trigger_now`
        self._hook("report_activity")

    async def tick(self):
        return self._apply("tick", self.machine.tick())

    async def pending_actions(self):
        self._hook("pending_actions")
        actions, self.actions = self.actions, []
        return actions

    async def state(self):
        self._hook("state")
        return self.machine.status()

    @property
    def level(self) -> State:
        return self.machine.state


class FakeReplay:
    def __init__(self) -> None:
        self.trainable = 0

    async def stats(self):
        return {"trainable": self.trainable}


class Handle:
    """`handle.method.remote(...)` returns an awaitable, as a Ray actor handle's does."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str):
        method = getattr(self._target, name)
        return type("Method", (), {"remote": staticmethod(method)})


class FakeJob:
    """Stands in for `train.job.TrainJob`: runs until the test calls `finish`, `crash` or `die`."""

    instances: list[FakeJob] = []
    fail_start: Exception | None = None  # the next start() raises this (a run that crashes at start)
    use_lock = False  # take the storage root's real run lock, as `TrainJob.start` does

    def __init__(self, cfg, *, run_name: str = "grpo", max_steps: int | None = None, **kw: Any) -> None:
        self.run_name, self.max_steps, self.kw = run_name, max_steps, kw
        self.started, self.done = threading.Event(), threading.Event()
        self.stop_requested, self.result, self.lease = False, None, None
        FakeJob.instances.append(self)

    def start(self) -> None:
        if FakeJob.fail_start is not None:
            exc, FakeJob.fail_start = FakeJob.fail_start, None
            raise exc
        if FakeJob.use_lock:
            from train.job import take_run_lock

            self.lease = take_run_lock(self.kw["storage"], self.kw["holder"], self.kw["state"])
        self.started.set()

    @property
    def running(self) -> bool:
        return self.started.is_set() and not self.done.is_set()

    def request_stop(self) -> None:
        self.stop_requested = True

    def status(self) -> dict[str, Any]:
        return {"state": "running" if self.running else "finished"}

    def wait(self, timeout: float | None = None):
        self.done.wait(timeout)
        return self.result

    def finish(self, stop_reason: str = "max_steps") -> None:
        from train.job import TrainResult

        self.result = TrainResult(run_name=self.run_name, steps=[], checkpoint=None, stop_reason=stop_reason)
        self.crash()

    def crash(self) -> None:
        """The run's thread died with an exception: no result."""
        if self.lease is not None:
            self.lease.release()
        self.done.set()

    die = crash  # the process that ran it died: the same, seen from a restarted Controller


@pytest.fixture
def system(tmp_path, monkeypatch, state_cfg):
    """(make_controller, omls, replay): every Controller made shares one persisted state and OMLS; its
    storage root is `tmp_path / root` ("state" unless a test moves it to another host's folder)."""
    import train.job
    from core.config import load_config

    FakeJob.instances, FakeJob.fail_start, FakeJob.use_lock = [], None, False
    monkeypatch.setattr(train.job, "TrainJob", FakeJob)
    omls, replay = FakeOMLS(), FakeReplay()
    handles = {"OMLS": Handle(omls), "Replay": Handle(replay)}
    monkeypatch.setattr(ControllerActor, "_actor", staticmethod(handles.get))
    made: list[ControllerActor] = []

    async def make(mode: str = "auto", root: str = "state") -> ControllerActor:
        env = {"CLAWRAY__STORAGE_ROOT": str(tmp_path / root), "CLAWRAY__SCHEDULER__MODE": mode}
        if state_cfg.dsn:
            env |= {"CLAWRAY__STATE__DSN": state_cfg.dsn, "CLAWRAY__STATE__NAMESPACE": state_cfg.namespace}
        cfg = load_config(REPO / "configs" / "local.yaml", env=env).model_dump(mode="json")
        # Built outside the event loop, so it starts no control loop of its own: the test ticks it.
        made.append(await asyncio.to_thread(ControllerActor, cfg))
        return made[-1]

    make.state = state_cfg
    yield make, omls, replay
    for ctl in made:  # what a killed actor's process would drop: its connections
        ctl.store.close()
        ctl.run_lock.close()


def running(ctl: ControllerActor) -> bool:
    return ctl.job is not None and ctl.job.running


async def settle(ctl: ControllerActor, omls: FakeOMLS, ticks: int = 3) -> None:
    """Tick; after every tick OMLS may say UPDATING/PAUSING only while a training run really runs."""
    for _ in range(ticks):
        await ctl.tick()
        if omls.level in (State.UPDATING, State.PAUSING):
            assert running(ctl), f"OMLS wedged in {omls.level.value}: no training run exists"


async def next_window_opens(ctl: ControllerActor, omls: FakeOMLS) -> FakeJob:
    """From IDLE_WAIT a new window opens and gets a training run of its own."""
    assert omls.level is State.IDLE_WAIT
    assert [t["dst"] for t in await omls.trigger_now()] == ["window_open"]
    before = len(FakeJob.instances)
    await settle(ctl, omls)
    assert omls.level is State.UPDATING and len(FakeJob.instances) == before + 1
    job = FakeJob.instances[-1]
    assert job.running and ctl.current["reason"] == "window"
    return job


async def test_window_opened_during_a_manual_run_never_wedges_omls(system):
    make, omls, _ = system
    ctl = await make()
    manual_call = asyncio.create_task(ctl.train_step(1))
    while not FakeJob.instances:
        await asyncio.sleep(0)  # the task runs up to job.start
    manual = FakeJob.instances[0]
    await asyncio.to_thread(manual.started.wait, 10)

    await omls.trigger_now()  # the window opens while the manual run is going
    await settle(ctl, omls)
    assert len(FakeJob.instances) == 1  # never two runs

    manual.finish()
    assert (await manual_call)["event"] == "run_finished"
    await settle(ctl, omls)  # the window gets its own run once the manual one has ended
    window = FakeJob.instances[-1]
    assert window is not manual and window.running and omls.level is State.UPDATING

    window.finish()
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT
    await next_window_opens(ctl, omls)


async def test_window_opened_during_an_rl_run_never_wedges_omls(system):
    make, omls, replay = system
    ctl = await make("rl")
    replay.trainable = 100
    await settle(ctl, omls, ticks=1)
    (rl,) = FakeJob.instances
    assert rl.running and ctl.current["reason"] == "rl"

    await omls.trigger_now()  # rl mode trains on samples, not in windows: the window is declined
    await settle(ctl, omls)
    assert len(FakeJob.instances) == 1 and omls.level is State.IDLE_WAIT

    replay.trainable = 0
    rl.finish()
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT and not running(ctl)


async def test_controller_killed_after_saving_the_finished_run_before_telling_omls(system):
    make, omls, _ = system
    ctl = await make()
    job = await next_window_opens(ctl, omls)

    job.finish()
    omls.fail_next["training_stopped"] = Killed()
    with pytest.raises(Killed):
        await settle(ctl, omls)
    assert omls.level is State.UPDATING  # OMLS never heard that the run ended

    ctl = await make()  # the restarted Controller: only the storage root survived
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT
    await next_window_opens(ctl, omls)


async def test_controller_killed_after_saving_the_started_run_before_telling_omls(system):
    make, omls, _ = system
    ctl = await make()
    await omls.trigger_now()
    omls.fail_next["training_started"] = Killed()
    with pytest.raises(Killed):
        await ctl.tick()
    (lost,) = FakeJob.instances
    lost.die()  # the run died with the Controller's process
    assert omls.level is State.WINDOW_OPEN

    ctl = await make()
    await settle(ctl, omls)  # the lost run is resumed (same run name) while its window is open
    resumed = FakeJob.instances[-1]
    assert resumed is not lost and resumed.running and resumed.run_name == lost.run_name
    assert omls.level is State.UPDATING

    resumed.finish()
    await settle(ctl, omls)
    await next_window_opens(ctl, omls)


async def test_a_run_that_crashes_at_start_leads_back_to_the_next_window(system):
    make, omls, _ = system
    ctl = await make()
    await omls.trigger_now()
    FakeJob.fail_start = RuntimeError("no Replay actor")
    try:
        await ctl.tick()
    except RuntimeError:
        pass  # today's tick raises; the control loop logs it and ticks again
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT and not running(ctl)
    failed = [h for h in ctl.history if h["event"] == "run_finished"]
    assert failed and "no Replay actor" in (failed[-1].get("error") or "")
    await next_window_opens(ctl, omls)


async def test_a_run_that_crashes_mid_window_leads_back_to_the_next_window(system):
    make, omls, _ = system
    ctl = await make()
    job = await next_window_opens(ctl, omls)
    job.crash()
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT
    await next_window_opens(ctl, omls)


async def test_omls_unreachable_when_the_run_ends_is_told_on_a_later_tick(system):
    make, omls, _ = system
    ctl = await make()
    job = await next_window_opens(ctl, omls)
    job.finish()
    omls.fail_next["training_stopped"] = Unavailable("OMLS is restarting")
    try:
        await ctl.tick()
    except Unavailable:
        pass  # the control loop logs a failed tick and ticks again
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT
    await next_window_opens(ctl, omls)


async def test_window_closing_stops_only_the_window_run(system):
    make, omls, _ = system
    ctl = await make()
    job = await next_window_opens(ctl, omls)
    await omls.cancel_trigger()  # the user is back: UPDATING -> PAUSING, stop_training
    await settle(ctl, omls, ticks=1)
    assert job.stop_requested and omls.level is State.PAUSING
    job.finish("stop_requested")
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT


async def test_every_run_is_recorded_even_when_a_manual_start_comes_before_the_reaping_tick(system):
    make, omls, _ = system
    ctl = await make()
    window = await next_window_opens(ctl, omls)
    window.finish()  # ended; no tick has reaped it yet
    call = asyncio.create_task(ctl.train_step(1))
    while len(FakeJob.instances) < 2:
        await asyncio.sleep(0)
    manual = FakeJob.instances[-1]
    await asyncio.to_thread(manual.started.wait, 10)
    manual.finish()
    await call
    finished = [h["run"] for h in ctl.history if h["event"] == "run_finished"]
    started = [h["run"] for h in ctl.history if h["event"] == "run_started"]
    assert finished == started == [1, 2]
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT


# ---------------------------------------------------------------------------- the decision table


@pytest.mark.parametrize(("mode", "omls", "run", "resume", "action"), [
    ("auto", "window_open", None, False, "start"),
    ("auto", "window_open", "window", False, "ack_started"),  # started, OMLS missed the ack
    ("auto", "window_open", "manual", False, None),  # the window waits for the manual run
    ("rl", "window_open", "rl", False, "ack_stopped"),  # declined: rl trains on samples, not windows
    ("skills_only", "window_open", None, False, "ack_stopped"),
    ("auto", "updating", "window", False, None),
    ("auto", "updating", None, False, "ack_stopped"),  # ended, crashed, or its end was never told
    ("auto", "updating", None, True, "start"),  # the previous Controller's run: resume it
    ("rl", "updating", None, True, "ack_stopped"),
    ("auto", "updating", "manual", False, "ack_stopped"),
    ("auto", "pausing", "window", False, "stop"),
    ("auto", "pausing", None, True, "ack_stopped"),  # closed while we were down: nothing to resume
    ("auto", "idle_wait", "window", False, "stop"),  # its window closed before the start was told
    ("auto", "idle_wait", "manual", False, None),  # a window close never stops a manual run
    ("auto", "idle_wait", None, False, None),
])
def test_reconcile_table(mode, omls, run, resume, action):
    from cluster.reconcile import reconcile

    assert reconcile(mode, omls, run, resume) == action


# ---------------------------------------------------------------------------- one trainer at a time


def _hold_lock(root: str, state: dict, held, done) -> None:
    """Another process (`python -m train.job`) holds the run lock until told."""
    from core.storage import StorageLayout
    from train.run_lock import run_lock_for  # what train.job's take_run_lock takes (lighter to import)

    lease = run_lock_for(StorageLayout(Path(root)), state).acquire("python -m train.job (run 'grpo')")
    held.set()
    done.wait(60)
    lease.release()


async def test_a_run_of_another_process_refuses_train_step_and_holds_the_window_until_it_ends(system, tmp_path):
    import multiprocessing

    make, omls, _ = system
    FakeJob.use_lock = True
    ctl = await make()
    ctx = multiprocessing.get_context("spawn")
    held, done = ctx.Event(), ctx.Event()
    args = (str(tmp_path / "state"), make.state.model_dump(), held, done)
    other = ctx.Process(target=_hold_lock, args=args, daemon=True)
    other.start()
    try:
        assert await asyncio.to_thread(held.wait, 60)
        answer = await ctl.train_step(1)
        assert answer["error"].startswith("a training run is already running since ")
        assert "python -m train.job" in answer["error"] and f"pid {other.pid}" in answer["error"]
        assert (await ctl.status())["run_lock"]["holder"] == "python -m train.job (run 'grpo')"

        await omls.trigger_now()
        await settle(ctl, omls)  # the window waits: OMLS is not told a run started
        assert omls.level is State.WINDOW_OPEN and not running(ctl)
        assert [h["event"] for h in ctl.history].count("window_waiting") == 1  # said once, not per tick
    finally:
        done.set()
        await asyncio.to_thread(other.join, 60)
    await settle(ctl, omls)  # the other run has ended: the window gets its run
    assert omls.level is State.UPDATING and running(ctl)
    assert (await ctl.status())["run_lock"]["holder"].startswith("Controller window run")
    FakeJob.instances[-1].finish()
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT and (await ctl.status())["run_lock"] is None


# ---------------------------------------------------------------------------- persisted state (issue 13)


async def test_a_stale_controller_incarnation_cannot_overwrite_its_successors_state(system):
    """An old incarnation still running after its restart (a partitioned node) writes nothing: its save
    fails on the version its successor moved on, and the successor's state stands."""
    from core.kv import Conflict

    make, omls, _ = system
    old = await make()
    await next_window_opens(old, omls)
    new = await make()  # restarted: it finds the window run lost with the old process
    assert [h["event"] for h in new.history][-1] == "run_lost"

    with pytest.raises(Conflict):
        old._event("run_finished", run=old.current["run"], reason="window", steps=3)
    again = await make()
    assert again.history == new.history and again.runs == new.runs == 1  # no trace of the stale write


@pytest.mark.parametrize("state_cfg", ["postgresql"], indirect=True)
async def test_on_postgresql_a_controller_restarted_on_another_host_resumes_its_window_run(system):
    """The state outlives the node: a Controller restarted on another host (another storage root, the
    same state database) finds the run its predecessor was driving and resumes it in the open window,
    and the run lock it takes is the one every host shares."""
    make, omls, _ = system
    FakeJob.use_lock = True
    ctl = await make(root="host-a")
    lost = await next_window_opens(ctl, omls)
    lost.die()  # the node is gone, and the run with it

    ctl = await make(root="host-b")
    assert ctl.runs == 1 and [h["event"] for h in ctl.history][-2:] == ["run_started", "run_lost"]
    await settle(ctl, omls)
    resumed = FakeJob.instances[-1]
    assert resumed is not lost and resumed.running and omls.level is State.UPDATING
    assert (await ctl.status())["run_lock"]["holder"] == "Controller window run 2"
    resumed.finish()
    await settle(ctl, omls)
    assert omls.level is State.IDLE_WAIT


async def test_the_controller_adopts_the_state_file_of_an_older_release(system, tmp_path):
    from core.storage import atomic_write_json

    make, _, _ = system
    legacy = tmp_path / "state" / "control" / "controller.json"
    history = [{"event": "run_started", "at": 1.0, "run": 4, "reason": "manual"},
               {"event": "run_finished", "at": 2.0, "run": 4, "reason": "manual", "steps": 1}]
    atomic_write_json(legacy, {"runs": 4, "history": history, "current": None})
    ctl = await make()
    assert ctl.runs == 4 and ctl.history == history and not legacy.exists()
    assert (await make()).history == history  # adopted once: read from the store from now on
