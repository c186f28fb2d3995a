"""OMLS state machine and idle signals, with a fake clock: no Ray, no waiting, no network."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cluster.omls import OMLS, Action, State
from cluster.signals import OSIdleSignal, ProxyInactivitySignal, Signal, SleepHoursSignal


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        self.now += timedelta(**kw)


class FakeSignal(Signal):
    """Idle when told; `until` is the known end of the idle period (None = unknown)."""

    def __init__(self, name: str = "fake", idle: bool = False, until: datetime | None = None) -> None:
        self.name, self.idle, self.until = name, idle, until
        self.next_start: datetime | None = None

    def is_idle(self, now: datetime) -> bool:
        return self.idle

    def idle_until(self, now: datetime) -> datetime | None:
        return self.until if self.idle else None

    def next_idle_start(self, now: datetime) -> datetime | None:
        return self.next_start

    def describe(self) -> str:
        return f"fake {self.name}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2025, 3, 5, 12, 0, tzinfo=UTC))


def _actions(transitions) -> list[Action | None]:
    return [t.action for t in transitions]


# ---------------------------------------------------------------------------- state machine


def test_full_cycle_idle_wait_window_open_updating_pausing_idle_wait(clock):
    sig = FakeSignal()
    m = OMLS([sig], clock)
    assert m.tick() == [] and m.state is State.IDLE_WAIT

    sig.idle = True
    (t,) = m.tick()
    assert (t.src, t.dst, t.action) == (State.IDLE_WAIT, State.WINDOW_OPEN, Action.START_TRAINING)
    assert m.opened_by == ["fake"] and m.open_signals == ["fake"]
    assert m.tick() == []  # level, not edge: no second start

    (t,) = m.training_started()
    assert (t.dst, t.action) == (State.UPDATING, None)

    sig.idle = False
    (t,) = m.tick()
    assert (t.src, t.dst, t.action) == (State.UPDATING, State.PAUSING, Action.STOP_TRAINING)
    assert m.tick() == []  # PAUSING waits for the acknowledgement

    (t,) = m.training_stopped()
    assert (t.src, t.dst) == (State.PAUSING, State.IDLE_WAIT)


def test_window_closing_before_training_starts_cancels(clock):
    sig = FakeSignal(idle=True)
    m = OMLS([sig], clock)
    m.tick()
    sig.idle = False
    (t,) = m.tick()
    assert (t.src, t.dst, t.action) == (State.WINDOW_OPEN, State.IDLE_WAIT, Action.CANCEL_TRAINING)
    assert m.opened_by == []


def test_pausing_stays_until_stop_acknowledged_even_if_idle_again(clock):
    sig = FakeSignal(idle=True)
    m = OMLS([sig], clock)
    m.tick(), m.training_started()
    sig.idle = False
    m.tick()
    sig.idle = True  # user left again before the job stopped
    assert m.tick() == [] and m.state is State.PAUSING
    m.training_stopped()
    assert m.state is State.IDLE_WAIT
    (t,) = m.tick()  # the window was not consumed: it closed in between
    assert t.dst is State.WINDOW_OPEN


def test_any_one_signal_opens_and_keeps_window_open(clock):
    a, b = FakeSignal("a"), FakeSignal("b", idle=True)
    m = OMLS([a, b], clock)
    m.tick()
    assert m.state is State.WINDOW_OPEN and m.opened_by == ["b"]
    a.idle, b.idle = True, False
    assert m.tick() == [] and m.open_signals == ["a"]
    a.idle = False
    assert m.tick()[0].dst is State.IDLE_WAIT


def test_training_ending_inside_window_consumes_it_until_signals_close(clock):
    sig = FakeSignal(idle=True)
    m = OMLS([sig], clock)
    m.tick(), m.training_started()
    (t,) = m.training_stopped()  # step budget spent while still idle
    assert (t.src, t.dst) == (State.UPDATING, State.IDLE_WAIT) and m.consumed
    assert m.tick() == []  # no restart every poll during the same sleep
    sig.idle = False
    m.tick()
    assert not m.consumed
    sig.idle = True
    assert m.tick()[0].dst is State.WINDOW_OPEN


def test_min_window_refuses_short_known_period_and_accepts_long_one(clock):
    sig = FakeSignal(idle=True, until=clock.now + timedelta(minutes=5))
    m = OMLS([sig], clock, min_window_minutes=10)
    assert m.tick() == [] and m.state is State.IDLE_WAIT
    assert m.open_signals == ["fake"]  # idle, but too short to be worth a window
    sig.until = clock.now + timedelta(minutes=10)
    assert m.tick()[0].dst is State.WINDOW_OPEN


def test_min_window_does_not_close_an_open_window(clock):
    sig = FakeSignal(idle=True, until=clock.now + timedelta(hours=1))
    m = OMLS([sig], clock, min_window_minutes=10)
    m.tick()
    clock.advance(minutes=55)  # 5 min left: too short to open, but the window is already open
    assert m.tick() == [] and m.state is State.WINDOW_OPEN


def test_unknown_end_signal_qualifies_despite_min_window(clock):
    sig = FakeSignal(idle=True, until=None)
    m = OMLS([sig], clock, min_window_minutes=60)
    assert m.tick()[0].dst is State.WINDOW_OPEN


def test_manual_trigger_opens_window_until_trained_once(clock):
    sig = FakeSignal(idle=False)
    m = OMLS([sig], clock)
    (t,) = m.trigger_now()
    assert (t.dst, t.action, t.reason) == (State.WINDOW_OPEN, Action.START_TRAINING, "manual trigger")
    assert m.opened_by == ["manual"]
    m.training_started()
    assert m.tick() == [] and m.state is State.UPDATING  # user active, but manual holds the window
    m.training_stopped()
    assert not m.manual and m.state is State.IDLE_WAIT
    assert m.tick() == []


def test_cancelled_manual_trigger_closes_window(clock):
    m = OMLS([FakeSignal()], clock)
    m.trigger_now()
    (t,) = m.cancel_trigger()
    assert (t.dst, t.action) == (State.IDLE_WAIT, Action.CANCEL_TRAINING)
    m.trigger_now(), m.training_started()
    (t,) = m.cancel_trigger()
    assert (t.dst, t.action) == (State.PAUSING, Action.STOP_TRAINING)


def test_manual_trigger_overrides_consumed_window(clock):
    sig = FakeSignal(idle=True)
    m = OMLS([sig], clock)
    m.tick(), m.training_started(), m.training_stopped()
    assert m.consumed and m.tick() == []
    assert m.trigger_now()[0].dst is State.WINDOW_OPEN


def test_training_stopped_while_window_open_means_declined(clock):
    m = OMLS([FakeSignal(idle=True)], clock)
    m.tick()
    (t,) = m.training_stopped()
    assert t.dst is State.IDLE_WAIT and m.consumed


def test_training_started_outside_window_is_recorded_then_paused(clock):
    m = OMLS([FakeSignal()], clock)
    (t,) = m.training_started()
    assert t.dst is State.UPDATING
    assert m.tick()[0].action is Action.STOP_TRAINING


def test_events_in_wrong_state_are_noops(clock):
    m = OMLS([FakeSignal()], clock)
    assert m.training_stopped() == []
    m.trigger_now(), m.training_started()
    assert m.training_started() == []


def test_naive_clock_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        OMLS([], lambda: datetime(2025, 1, 1))


def test_persistence_round_trip(clock):
    sig = FakeSignal(idle=True)
    m = OMLS([sig], clock)
    m.trigger_now(), m.training_started()
    doc = json.loads(json.dumps(m.to_dict()))  # must survive JSON
    clock.advance(minutes=3)
    m2 = OMLS([sig], clock)
    m2.load_dict(doc)
    assert (m2.state, m2.since, m2.manual, m2.opened_by) == (State.UPDATING, m.since, True, ["manual"])
    assert m2.to_dict() == m.to_dict()


def test_load_dict_rejects_bad_documents(clock):
    m = OMLS([], clock)
    with pytest.raises(ValueError, match="version"):
        m.load_dict({"state": "updating"})
    with pytest.raises(ValueError, match="bad OMLS state"):
        m.load_dict({"version": 1, "state": "flying", "since": clock.now.isoformat()})


def test_next_window_is_earliest_long_enough_start(clock):
    soon, later = FakeSignal("soon"), FakeSignal("later")
    soon.next_start = clock.now + timedelta(hours=1)
    later.next_start = clock.now + timedelta(hours=3)
    m = OMLS([soon, later], clock)
    assert m.next_window() == soon.next_start
    assert m.status()["next_window"] == soon.next_start.isoformat()
    m.trigger_now()
    assert m.next_window() is None  # a window is open now


def test_next_window_skips_sleep_shorter_than_min_window(clock):
    short = SleepHoursSignal("13:00", "13:05", "UTC")
    m = OMLS([short], clock, min_window_minutes=10)
    assert m.next_window() is None
    m = OMLS([short], clock, min_window_minutes=5)
    assert m.next_window() == datetime(2025, 3, 5, 13, 0, tzinfo=UTC)


# ---------------------------------------------------------------------------- signals


def test_sleep_hours_wrap_midnight_in_time_zone():
    s = SleepHoursSignal("23:00", "07:00", "America/New_York")
    ny = ZoneInfo("America/New_York")
    assert s.is_idle(datetime(2025, 3, 5, 23, 30, tzinfo=ny))
    assert s.is_idle(datetime(2025, 3, 6, 6, 59, tzinfo=ny))
    assert not s.is_idle(datetime(2025, 3, 6, 7, 0, tzinfo=ny))  # end is exclusive
    assert not s.is_idle(datetime(2025, 3, 5, 22, 59, tzinfo=ny))
    # 04:00 UTC is 23:00 the previous evening in New York (UTC-5 in early March).
    now = datetime(2025, 3, 5, 4, 0, tzinfo=UTC)
    assert s.is_idle(now)
    assert s.idle_until(now) == datetime(2025, 3, 5, 7, 0, tzinfo=ny)
    assert s.next_idle_start(now) == datetime(2025, 3, 5, 23, 0, tzinfo=ny)


def test_sleep_hours_morning_part_and_same_day_window():
    s = SleepHoursSignal("23:00", "07:00", "Asia/Tokyo")
    tokyo = ZoneInfo("Asia/Tokyo")
    now = datetime(2025, 3, 6, 2, 0, tzinfo=tokyo)
    assert s.idle_until(now) == datetime(2025, 3, 6, 7, 0, tzinfo=tokyo)
    day = SleepHoursSignal("01:00", "06:00", "UTC")
    assert day.is_idle(datetime(2025, 3, 5, 3, 0, tzinfo=UTC))
    assert not day.is_idle(datetime(2025, 3, 5, 23, 0, tzinfo=UTC))
    assert day.next_idle_start(datetime(2025, 3, 5, 23, 0, tzinfo=UTC)) == datetime(
        2025, 3, 6, 1, 0, tzinfo=UTC
    )


def test_sleep_ending_soon_does_not_open_a_window():
    clock = FakeClock(datetime(2025, 3, 6, 6, 55, tzinfo=UTC))  # 5 min before the end
    m = OMLS([SleepHoursSignal("23:00", "07:00", "UTC")], clock, min_window_minutes=10)
    assert m.tick() == []
    clock.now = datetime(2025, 3, 5, 23, 0, tzinfo=UTC)
    assert m.tick()[0].dst is State.WINDOW_OPEN


def test_sleep_hours_rejects_bad_input():
    with pytest.raises(ValueError, match="HH:MM"):
        SleepHoursSignal("25:00", "07:00")
    with pytest.raises(ValueError, match="empty"):
        SleepHoursSignal("07:00", "07:00")


def test_proxy_inactivity_opens_only_after_threshold_and_activity_resets_it(clock):
    s = ProxyInactivitySignal(30, clock)
    m = OMLS([s], clock, min_window_minutes=10)
    clock.advance(minutes=29)
    assert m.tick() == []
    assert s.next_idle_start(clock.now) == clock.now + timedelta(minutes=1)
    clock.advance(minutes=1)
    assert m.tick()[0].dst is State.WINDOW_OPEN
    s.report_activity(clock.now)
    assert m.tick()[0].dst is State.IDLE_WAIT
    s.report_activity(clock.now - timedelta(hours=1))  # a late, older report changes nothing
    assert s.last_activity == clock.now


def test_os_idle_absent_tool_is_off_with_one_log_line(caplog):
    with caplog.at_level(logging.WARNING, logger="cluster.signals"):
        s = OSIdleSignal(5, platform="linux", which=lambda name: None)
        assert not s.is_idle(datetime.now(UTC)) and not s.is_idle(datetime.now(UTC))
    assert not s.available
    assert len([r for r in caplog.records if "xprintidle" in r.getMessage()]) == 1


def test_os_idle_parses_xprintidle_and_ioreg():
    linux = OSIdleSignal(5, platform="linux", which=lambda n: "/usr/bin/" + n, run=lambda argv: "301000\n")
    assert linux.idle_seconds() == 301.0 and linux.is_idle(datetime.now(UTC))
    ioreg_out = '  |   "HIDIdleTime" = 120000000000\n'
    mac = OSIdleSignal(5, platform="darwin", which=lambda n: "/usr/sbin/" + n, run=lambda argv: ioreg_out)
    assert mac.idle_seconds() == 120.0 and not mac.is_idle(datetime.now(UTC))


def test_os_idle_failing_tool_is_off_with_one_log_line(caplog):
    def fail(argv):
        raise OSError("cannot open display")

    s = OSIdleSignal(5, platform="linux", which=lambda n: "/usr/bin/" + n, run=fail)
    with caplog.at_level(logging.WARNING, logger="cluster.signals"):
        assert not s.is_idle(datetime.now(UTC)) and not s.is_idle(datetime.now(UTC))
    assert len(caplog.records) == 1 and "display" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------- builder


def test_build_signals_follows_scheduler_config(tmp_path):
    from cluster.omls_actor import build_signals
    from core.config import SchedulerConfig

    clock = FakeClock(datetime(2025, 3, 5, 12, 0, tzinfo=UTC))
    assert [s.name for s in build_signals(SchedulerConfig(), clock)] == ["sleep_hours", "proxy_inactivity"]
    none = SchedulerConfig(sleep_start=None, idle_minutes=None)
    assert build_signals(none, clock) == []
    ics = tmp_path / "cal.ics"
    ics.write_text("BEGIN:VCALENDAR\nVERSION:2.0\nPRODID:-//t//t//EN\nEND:VCALENDAR\n")
    cfg = SchedulerConfig(sleep_start=None, idle_minutes=None, calendar_ics=str(ics), timezone="Europe/Paris")
    (cal,) = build_signals(cfg, clock)
    assert cal.name == "calendar" and not cal.is_idle(clock.now)
