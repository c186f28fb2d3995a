"""OMLS: the opportunistic idle-window state machine that gates slow-loop training (pure, no Ray).

    IDLE_WAIT   --(a signal idle long enough, or "train now")-->  WINDOW_OPEN   action start_training
    WINDOW_OPEN --(controller acknowledges: training_started)-->  UPDATING
    WINDOW_OPEN --(window closes before training starts)----->  IDLE_WAIT     action cancel_training
    UPDATING    --(window closes: user is back)-------------->  PAUSING       action stop_training
    PAUSING     --(controller acknowledges: training_stopped)->  IDLE_WAIT
    UPDATING    --(training ends by itself: training_stopped)->  IDLE_WAIT     (window consumed)

Semantics follow MetaClaw's SlowUpdateScheduler, with three additions:
  * A minimum window length: a window opens only on a signal whose known idle period (sleep end,
    meeting end) lasts at least `min_window`; signals with an unknown end (inactivity) qualify once
    their own threshold has passed. An open window stays open while ANY signal is idle.
  * A manual "train now" trigger: it opens a window regardless of signals and keeps it open until a
    training run has ended (`training_stopped`) or the trigger is cancelled.
  * A consumed window: when training ends by itself inside a window (its step budget is spent), the
    window does not reopen until every signal has gone non-idle once, so one sleep period does not
    restart the job every poll.

Actions are edge-triggered hints for the Controller; `state` is the level it can always re-read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from cluster.signals import Signal

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]  # returns an aware datetime
SCHEMA_VERSION = 1
MANUAL = "manual"  # the name a manual trigger appears under in `opened_by`


class State(StrEnum):
    IDLE_WAIT = "idle_wait"  # waiting for a qualifying window
    WINDOW_OPEN = "window_open"  # window open, start_training asked, not yet acknowledged
    UPDATING = "updating"  # training runs
    PAUSING = "pausing"  # window closed, stop_training asked, not yet acknowledged


class Action(StrEnum):
    START_TRAINING = "start_training"  # request resources, start or resume the job
    STOP_TRAINING = "stop_training"  # stop at the next step boundary, release resources
    CANCEL_TRAINING = "cancel_training"  # window closed before the job started: release resources


STATE_CODES = {s: i for i, s in enumerate(State)}  # numeric value for the window-state gauge


@dataclass(frozen=True)
class Transition:
    """One state change; `action` is what the Controller should do about it (None = nothing)."""

    src: State
    dst: State
    at: datetime
    reason: str
    action: Action | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src.value,
            "dst": self.dst.value,
            "at": self.at.isoformat(),
            "reason": self.reason,
            "action": self.action.value if self.action else None,
        }


class OMLS:
    """The state machine. Call `tick()` periodically; report controller events as they happen.

    Args:
        signals: idle signals; any one idle (and long enough) opens a window.
        clock: returns the current aware datetime (injectable for tests).
        min_window_minutes: shortest known idle period worth opening a window for.
    """

    def __init__(self, signals: Sequence[Signal], clock: Clock, min_window_minutes: float = 0.0) -> None:
        if min_window_minutes < 0:
            raise ValueError("min_window_minutes must be >= 0")
        self.signals = list(signals)
        self.clock = clock
        self.min_window = timedelta(minutes=min_window_minutes)
        self.state = State.IDLE_WAIT
        self.since: datetime = self._now()
        self.manual = False  # "train now" pending
        self.consumed = False  # training ended inside the current window; wait for it to close
        self.open_signals: list[str] = []  # idle signals at the last evaluation
        self.opened_by: list[str] = []  # what opened the current window

    def _now(self) -> datetime:
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError("the OMLS clock must return timezone-aware datetimes")
        return now

    # ------------------------------------------------------------------ evaluation

    def _long_enough(self, signal: Signal, now: datetime) -> bool:
        until = signal.idle_until(now)
        return until is None or until - now >= self.min_window

    def _evaluate(self, now: datetime) -> tuple[list[Signal], list[Signal]]:
        """Return (idle signals, idle signals whose period is long enough to open a window)."""
        idle = [s for s in self.signals if s.is_idle(now)]
        self.open_signals = [s.name for s in idle]
        return idle, [s for s in idle if self._long_enough(s, now)]

    def _go(self, dst: State, now: datetime, reason: str, action: Action | None = None) -> Transition:
        transition = Transition(self.state, dst, now, reason, action)
        logger.info("OMLS %s -> %s (%s)", self.state.value, dst.value, reason)
        self.state, self.since = dst, now
        return transition

    def tick(self) -> list[Transition]:
        """Evaluate the signals once; returns the transitions taken (zero or one)."""
        now = self._now()
        idle, qualifying = self._evaluate(now)
        active = self.manual or bool(idle)  # keeps an open window open
        if not idle:
            self.consumed = False  # the window has really closed; the next one may open
        if self.state is State.IDLE_WAIT:
            if self.manual:
                self.opened_by = [MANUAL]
                return [self._go(State.WINDOW_OPEN, now, "manual trigger", Action.START_TRAINING)]
            if qualifying and not self.consumed:
                self.opened_by = [s.name for s in qualifying]
                reason = "idle: " + ", ".join(self.opened_by)
                return [self._go(State.WINDOW_OPEN, now, reason, Action.START_TRAINING)]
        elif self.state is State.WINDOW_OPEN and not active:
            self.opened_by = []
            return [
                self._go(
                    State.IDLE_WAIT, now, "window closed before training started", Action.CANCEL_TRAINING
                )
            ]
        elif self.state is State.UPDATING and not active:
            return [self._go(State.PAUSING, now, "window closed: user active", Action.STOP_TRAINING)]
        return []  # PAUSING waits for training_stopped

    # ------------------------------------------------------------------ inputs

    def trigger_now(self) -> list[Transition]:
        """Manual "train now": open a window until one training run has ended or it is cancelled."""
        self.manual = True
        return self.tick()

    def cancel_trigger(self) -> list[Transition]:
        """Withdraw a manual trigger; the window then lives on signals alone."""
        self.manual = False
        return self.tick()

    def training_started(self) -> list[Transition]:
        """The Controller reports that the training job is running."""
        now = self._now()
        if self.state is State.WINDOW_OPEN:
            return [self._go(State.UPDATING, now, "training started")]
        if self.state is State.IDLE_WAIT:
            # A start raced with a window close: record the truth; the next tick pauses it if needed.
            logger.warning("OMLS: training started outside a window")
            return [self._go(State.UPDATING, now, "training started outside a window")]
        return []  # already UPDATING, or PAUSING where the stop request still stands

    def training_stopped(self) -> list[Transition]:
        """The Controller reports that the training job has stopped (finished, paused or failed)."""
        now = self._now()
        if self.state is State.PAUSING:
            return [self._go(State.IDLE_WAIT, now, "stop acknowledged")]
        if self.state in (State.UPDATING, State.WINDOW_OPEN):
            # The run ended on its own (step budget spent, declined, failed): this window is used up,
            # and a manual trigger has had its run.
            self.manual, self.consumed, self.opened_by = False, True, []
            return [self._go(State.IDLE_WAIT, now, "training ended inside the window")]
        return []

    # ------------------------------------------------------------------ status

    def next_window(self) -> datetime | None:
        """Earliest time a window is expected to open; None while one is open or nothing is known."""
        if self.state in (State.WINDOW_OPEN, State.UPDATING):
            return None
        now = self._now()
        starts = []
        for signal in self.signals:
            start = signal.next_idle_start(now)
            if start is not None and self._long_enough(signal, start):
                starts.append(start)
        return min(starts, default=None)

    def status(self) -> dict[str, Any]:
        """JSON-ready status for `clawray status` and the Controller."""
        nxt = self.next_window()
        return {
            "state": self.state.value,
            "since": self.since.isoformat(),
            "manual": self.manual,
            "consumed": self.consumed,
            "open_signals": list(self.open_signals),
            "opened_by": list(self.opened_by),
            "next_window": nxt.isoformat() if nxt else None,
            "signals": [s.describe() for s in self.signals],
        }

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "state": self.state.value,
            "since": self.since.isoformat(),
            "manual": self.manual,
            "consumed": self.consumed,
            "open_signals": list(self.open_signals),
            "opened_by": list(self.opened_by),
        }

    def load_dict(self, data: dict[str, Any]) -> None:
        """Restore what `to_dict` wrote. Raises ValueError on a document this version cannot read."""
        if data.get("version") != SCHEMA_VERSION:
            raise ValueError(f"OMLS state version {data.get('version')!r}, expected {SCHEMA_VERSION}")
        try:
            state = State(data["state"])
            since = datetime.fromisoformat(data["since"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"bad OMLS state document: {e}") from e
        if since.tzinfo is None:
            raise ValueError("bad OMLS state document: 'since' has no time zone")
        self.state, self.since = state, since
        self.manual = bool(data.get("manual", False))
        self.consumed = bool(data.get("consumed", False))
        self.open_signals = [str(s) for s in data.get("open_signals", [])]
        self.opened_by = [str(s) for s in data.get("opened_by", [])]
