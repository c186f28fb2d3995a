"""The named Ray actor `OMLS`: the idle-window state machine of `cluster/omls.py`, run and persisted.

It ticks on its own asyncio loop every `SchedulerConfig.poll_s`, takes activity reports from every
Proxy replica, and queues the actions the Controller pulls with `pending_actions()`. Its state lives in
the control store (core/kv.py, key `omls`: `<storage root>/control/control.db`, or PostgreSQL with
`state.dsn`), so a restarted actor (`max_restarts=-1`), on any node, resumes in the state it had, with
the same pending actions and last activity time. Every save is a compare-and-swap on the version this
incarnation last read or wrote: an old incarnation still running after its restart fails loudly instead
of overwriting its successor's state. The `control/omls.json` file of older releases is adopted once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray.util import metrics

from cluster.calendars import GoogleCalendarSignal, ICSCalendarSignal
from cluster.omls import OMLS, STATE_CODES, Clock, State, Transition
from cluster.signals import OSIdleSignal, ProxyInactivitySignal, Signal, SleepHoursSignal
from core import names
from core.config import SchedulerConfig, StateConfig
from core.kv import Conflict, adopt_json, control_store
from core.metrics import hold
from core.storage import StorageLayout

logger = logging.getLogger(__name__)

STATE_KEY = "omls"  # in the control store
LEGACY_FILE = "omls.json"  # under control/: where releases before the control store kept the state


def utc_now() -> datetime:
    return datetime.now(UTC)


def build_signals(cfg: SchedulerConfig, clock: Clock) -> list[Signal]:
    """Turn the scheduler section into signals; a field left None disables its signal.

    The Google Calendar fields are not in `SchedulerConfig` yet (proposed: `calendar_google_id`,
    `calendar_google_credentials`, `calendar_refresh_s`, `calendar_timeout_s`); read when present.
    """
    signals: list[Signal] = []
    if cfg.sleep_start is not None and cfg.sleep_end is not None:
        signals.append(SleepHoursSignal(cfg.sleep_start, cfg.sleep_end, cfg.timezone))
    if cfg.idle_minutes is not None:
        signals.append(ProxyInactivitySignal(cfg.idle_minutes, clock))
    if cfg.os_idle_minutes is not None:
        signals.append(OSIdleSignal(cfg.os_idle_minutes))
    refresh_s = getattr(cfg, "calendar_refresh_s", 300.0)
    if cfg.calendar_ics:
        timeout_s = getattr(cfg, "calendar_timeout_s", 10.0)
        signals.append(
            ICSCalendarSignal(cfg.calendar_ics, cfg.timezone, refresh_s=refresh_s, timeout_s=timeout_s)
        )
    google_id = getattr(cfg, "calendar_google_id", None)
    if google_id:
        creds = getattr(cfg, "calendar_google_credentials", None)
        signals.append(GoogleCalendarSignal(google_id, creds, refresh_s=refresh_s))
    return signals


def _as_datetime(ts: float | datetime) -> datetime:
    """Activity time from a Proxy: epoch seconds (time.time()) or an aware datetime."""
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise ValueError("activity timestamps must be timezone-aware")
        return ts
    return datetime.fromtimestamp(float(ts), tz=UTC)


class _Metrics:
    """Window state and signal levels for the Ray dashboard (Prometheus)."""

    def __init__(self) -> None:
        self.state = metrics.Gauge(
            "clawray_omls_window_state",
            description="OMLS state: 0 idle_wait, 1 window_open, 2 updating, 3 pausing.",
        )
        self.signal_idle = metrics.Gauge(
            "clawray_omls_signal_idle", description="1 while the signal reports idle.", tag_keys=("signal",)
        )
        self.transitions = metrics.Counter(
            "clawray_omls_transitions_total", description="OMLS state transitions.", tag_keys=("src", "dst")
        )

    def observe(self, machine: OMLS, transitions: list[Transition]) -> None:
        hold(self.state, STATE_CODES[machine.state])  # held: poll_s may exceed Ray's gauge TTL
        for signal in machine.signals:
            hold(self.signal_idle, 1.0 if signal.name in machine.open_signals else 0.0, {"signal": signal.name})
        for t in transitions:
            self.transitions.inc(tags={"src": t.src.value, "dst": t.dst.value})


class OMLSActor:
    """Ray actor wrapper; create it with `start_omls` so it gets its name and restart policy.

    Args:
        cfg: the scheduler section.
        storage_root: local or mounted path of the storage root.
        clock: returns an aware datetime; real UTC time by default.
        state: the `state` section (dict or `StateConfig`): where the control store lives.
    """

    def __init__(self, cfg: SchedulerConfig, storage_root: str, clock: Clock | None = None,
                 state: StateConfig | dict | None = None) -> None:
        self.cfg = cfg
        self.store = control_store(storage_root, state)
        self._version = 0  # of the stored state, as this incarnation last read or wrote it
        self._legacy = StorageLayout(Path(storage_root)).control / LEGACY_FILE
        clock = clock or utc_now
        signals = build_signals(cfg, clock)
        self.machine = OMLS(signals, clock, cfg.min_window_minutes)
        self.inactivity = next((s for s in signals if isinstance(s, ProxyInactivitySignal)), None)
        self.actions: list[dict[str, Any]] = []
        self._activity_dirty = False
        self.started_at = utc_now()  # per incarnation: tells a restarted actor from the old one
        # Serialises machine mutations: ticks run in a worker thread (signals may block on a
        # subprocess or an HTTP fetch) while events arrive on the actor's event loop.
        self._lock = asyncio.Lock()
        self._load()
        self._metrics = _Metrics()
        self._metrics.observe(self.machine, [])
        # Ray runs an async actor's constructor on the actor's event loop, so the loop can start here.
        self._task = asyncio.get_running_loop().create_task(self._run())

    # ------------------------------------------------------------------ persistence

    def _load(self) -> None:
        got = adopt_json(self.store, STATE_KEY, self._legacy)
        if got is None:
            return
        self._version, data = got
        try:
            self.machine.load_dict(data["omls"])
            self.actions = list(data.get("pending_actions", []))
            last = data.get("last_activity")
            if last and self.inactivity is not None:
                # Assign, not report: the persisted time is older than this incarnation's start,
                # and a restart must not reset the inactivity timer.
                self.inactivity.last_activity = datetime.fromisoformat(last)
        except (KeyError, TypeError, ValueError) as e:
            # A state file we cannot read must not keep the scheduler down: start fresh, loudly.
            logger.error("OMLS: ignoring unreadable state in %s: %s", self.store.db.describe(), e)
            return
        logger.info("OMLS restored state %s from %s", self.machine.state.value, self.store.db.describe())

    def _save(self) -> None:
        last = self.inactivity.last_activity.isoformat() if self.inactivity else None
        doc = {"omls": self.machine.to_dict(), "pending_actions": self.actions, "last_activity": last}
        try:
            self._version = self.store.put(STATE_KEY, doc, self._version)
        except Conflict:
            logger.error("OMLS: a newer incarnation owns the state; this one is stale and saves nothing")
            raise
        self._activity_dirty = False

    def _apply(self, transitions: list[Transition]) -> list[dict[str, Any]]:
        for t in transitions:
            if t.action is not None:
                self.actions.append(t.to_dict())
        if transitions or self._activity_dirty:
            self._save()
        self._metrics.observe(self.machine, transitions)
        return [t.to_dict() for t in transitions]

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            # One bad tick (a signal bug, a full disk) must not stop the scheduler for good.
            except Exception:  # noqa: BLE001
                logger.exception("OMLS tick failed")
            await asyncio.sleep(self.cfg.poll_s)

    async def tick(self) -> list[dict[str, Any]]:
        """Evaluate the signals now; returns the transitions taken as dicts."""
        async with self._lock:
            return self._apply(await asyncio.to_thread(self.machine.tick))

    # ------------------------------------------------------------------ inputs

    async def report_activity(self, ts: float | datetime) -> None:
        """A Proxy replica saw a user request at `ts` (epoch seconds or aware datetime)."""
        if self.inactivity is not None:
            self.inactivity.report_activity(_as_datetime(ts))
            self._activity_dirty = True  # persisted by the next tick, not per request

    async def trigger_now(self) -> list[dict[str, Any]]:
        """Manual "train now": opens a window until one training run has ended."""
        async with self._lock:
            return self._apply(await asyncio.to_thread(self.machine.trigger_now))

    async def cancel_trigger(self) -> list[dict[str, Any]]:
        async with self._lock:
            return self._apply(await asyncio.to_thread(self.machine.cancel_trigger))

    async def training_started(self) -> list[dict[str, Any]]:
        async with self._lock:
            return self._apply(self.machine.training_started())

    async def training_stopped(self) -> list[dict[str, Any]]:
        async with self._lock:
            return self._apply(self.machine.training_stopped())

    # ------------------------------------------------------------------ outputs

    async def pending_actions(self) -> list[dict[str, Any]]:
        """Return and clear the queued actions, oldest first (dicts from `Transition.to_dict`)."""
        async with self._lock:
            actions, self.actions = self.actions, []
            if actions:
                self._save()
            return actions

    async def state(self) -> dict[str, Any]:
        """Status: state, since, open signals, next window, manual trigger, signal descriptions."""
        async with self._lock:
            status = await asyncio.to_thread(self.machine.status)
        last = self.inactivity.last_activity.isoformat() if self.inactivity else None
        return {
            **status,
            "last_activity": last,
            "pending_actions": len(self.actions),
            "actor_started_at": self.started_at.isoformat(),
        }

    async def ready(self) -> bool:
        return True


def start_omls(
    cfg: SchedulerConfig,
    storage_root: str | Path,
    *,
    name: str = names.OMLS,
    namespace: str = names.DEFAULT_NAMESPACE,
    detached: bool = False,
    clock: Clock | None = None,
    state: StateConfig | dict | None = None,
) -> ray.actor.ActorHandle:
    """Create (or get, if it already runs) the named OMLS actor and wait until it answers.

    `namespace`: the Ray namespace it is named in (`ray.namespace`). `detached=True` keeps it alive after
    the creating driver exits (what `clawray start` wants).
    `state`: the config's `state` section (where its state is persisted; None: the embedded SQLite).
    """
    actor_cls = ray.remote(OMLSActor)
    names.forget(name, namespace)  # a handle this process cached may be of a killed incarnation
    handle = actor_cls.options(
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        max_restarts=-1,  # the persisted state makes a restart lossless
        num_cpus=0,  # mostly sleeps; must not hold a CPU that training could use
    ).remote(cfg, str(storage_root), clock, state)
    ray.get(handle.ready.remote())
    return handle


__all__ = ["OMLSActor", "State", "build_signals", "start_omls", "utc_now"]
