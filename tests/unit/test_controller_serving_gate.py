"""The Controller's serving gate: no window trains while vLLM is starting, and users cannot have been away
from a system that was not serving yet.

`serve run` and `clawray start` bring the actors up before the Serve app, and vLLM on loaded CPUs takes
minutes to start: OMLS's inactivity clock, running since the actor started, opened a window before any
user could arrive. The Controller then started that window's run the instant the engine first answered,
just as the first users came in: `make demo` spent its morning starting and stopping a doomed run (CI saw
a demo whose evening window then trained 0 steps). Driven tick by tick, with the real OMLS state machine
and a clock the test moves (tests/unit/test_invariant_control.py has the fakes).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from cluster.controller import ControllerActor
from cluster.omls import OMLS, State
from cluster.signals import ProxyInactivitySignal
from tests.unit import test_invariant_control as control
from tests.unit.test_invariant_control import FakeJob, FakeOMLS, Handle, settle

system = control.system  # the fakes' fixture, shared

IDLE_MINUTES = 0.5


class IdleOMLS(FakeOMLS):
    """OMLS with its inactivity signal (30 s) on a clock the test moves."""

    def __init__(self) -> None:
        super().__init__()
        self.now = datetime.now(UTC)
        self.inactivity = ProxyInactivitySignal(IDLE_MINUTES, lambda: self.now)
        self.machine = OMLS([self.inactivity], lambda: self.now)

    async def report_activity(self, ts):
        """Reported "now" (epoch seconds, as the Proxy does): now on the test's clock."""
        assert abs(ts - time.time()) < 60, ts
        self.inactivity.report_activity(self.now)

    def later(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def controller(system, monkeypatch, omls):
    make, _, replay = system
    handles = {"OMLS": Handle(omls), "Replay": Handle(replay)}
    monkeypatch.setattr(ControllerActor, "_actor", staticmethod(handles.get))
    ctl = await make()
    ctl.serving_app = "clawray"
    app = {"running": False}

    async def probe() -> bool:
        return app["running"]

    monkeypatch.setattr(ctl, "_probe_serving", probe)
    return ctl, app


async def test_a_window_that_opens_before_serving_runs_waits_for_the_serve_app(system, monkeypatch):
    """A window opened while vLLM starts by something other than inactivity (a manual trigger, sleep hours
    at start) waits for the app, then trains on the first tick after the engine answers."""
    _, omls, _ = system
    ctl, app = await controller(system, monkeypatch, omls)
    await omls.trigger_now()
    await ctl.tick()
    await ctl.tick()
    assert FakeJob.instances == [] and omls.level is State.WINDOW_OPEN
    assert [e["reason"] for e in ctl.history if e["event"] == "window_waiting"] == [
        "serving (clawray) is not running yet"]  # recorded once, not per tick
    app["running"] = True
    await settle(ctl, omls)
    assert len(FakeJob.instances) == 1 and omls.level is State.UPDATING


async def test_inactivity_while_serving_starts_is_not_absence(system, monkeypatch):
    """The demo's lost morning: the inactivity window that opened during vLLM's start is closed when the
    engine first answers (the clock starts then), never trained; the next real absence trains."""
    omls = IdleOMLS()
    ctl, app = await controller(system, monkeypatch, omls)
    await ctl.tick()  # the engine is not up yet
    omls.later(31)
    await omls.tick()
    assert omls.level is State.WINDOW_OPEN  # opened by inactivity while vLLM starts
    await ctl.tick()
    assert FakeJob.instances == []
    app["running"] = True  # vLLM is up: users can arrive from now on
    await settle(ctl, omls)
    assert FakeJob.instances == [] and omls.level is State.IDLE_WAIT
    assert [e["event"] for e in ctl.history][-2:] == ["serving_up", "window_cancel_training"]
    omls.later(20)
    await omls.tick()
    await settle(ctl, omls)
    assert FakeJob.instances == [] and omls.level is State.IDLE_WAIT  # 20 s after serving came up
    omls.later(11)
    await omls.tick()
    await settle(ctl, omls)
    assert len(FakeJob.instances) == 1 and omls.level is State.UPDATING  # away since serving came up


async def test_a_controller_that_finds_serving_up_reports_no_activity(system, monkeypatch):
    """A Controller restarted while the app serves did not see serving start: an open window stays open
    and trains (reporting activity here would cut a real absence short)."""
    omls = IdleOMLS()
    ctl, app = await controller(system, monkeypatch, omls)
    app["running"] = True
    omls.later(31)
    await omls.tick()
    await settle(ctl, omls)
    assert len(FakeJob.instances) == 1 and omls.level is State.UPDATING
    assert "serving_up" not in [e["event"] for e in ctl.history]
