"""Idle signals for the OMLS scheduler: each says whether the user is away right now.

A signal answers three questions about an instant `now` (an aware datetime):
  * `is_idle(now)`          — is this a good moment to train?
  * `idle_until(now)`       — when does the current idle period end, if known (sleep end, meeting end)?
  * `next_idle_start(now)`  — when does the next idle period start, if known (for `clawray status`)?
`describe()` is one human line for status output. Signals hold no Ray state and read no config; the
builder in `cluster/omls_actor.py` turns a `SchedulerConfig` into signals. Calendar signals live in
`cluster/calendars.py`.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]  # returns an aware datetime


class Signal(ABC):
    """One idle condition. Subclasses implement `is_idle` and `describe`; the rest is optional."""

    name: str = "signal"

    @abstractmethod
    def is_idle(self, now: datetime) -> bool: ...

    @abstractmethod
    def describe(self) -> str: ...

    def idle_until(self, now: datetime) -> datetime | None:
        """End of the idle period containing `now`; None when unknown or not idle."""
        return None

    def next_idle_start(self, now: datetime) -> datetime | None:
        """Start of the next idle period strictly after the current one; None when unknown."""
        return None


def _parse_hhmm(value: str) -> time:
    if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", value):
        raise ValueError(f"{value!r} is not a HH:MM time")
    hh, mm = value.split(":")
    return time(int(hh), int(mm))


class SleepHoursSignal(Signal):
    """Idle between `start` and `end` local time (HH:MM) in an IANA time zone; wraps midnight.

    The interval is half-open, [start, end): at exactly `end` the user is considered awake.
    """

    name = "sleep_hours"

    def __init__(self, start: str, end: str, tz: str = "UTC") -> None:
        self.start, self.end = _parse_hhmm(start), _parse_hhmm(end)
        if self.start == self.end:
            raise ValueError(f"sleep hours {start}-{end} are empty; set sleep_start to None to disable")
        self.tz = ZoneInfo(tz)  # raises ZoneInfoNotFoundError for an unknown zone
        self._label = f"{start}-{end} {tz}"

    def _at(self, day, t: time) -> datetime:
        # NOTE: on a DST change day a wall time may not exist or exist twice; zoneinfo picks fold=0,
        # which shifts the boundary by the DST offset at most — harmless for a scheduling window.
        return datetime.combine(day, t, tzinfo=self.tz)

    def _period(self, now: datetime) -> tuple[datetime, datetime] | None:
        """The sleep period containing `now` as (start, end) aware datetimes, or None."""
        local = now.astimezone(self.tz)
        t, day = local.time(), local.date()
        if self.start < self.end:  # same-day window, e.g. 01:00-06:00
            if self.start <= t < self.end:
                return self._at(day, self.start), self._at(day, self.end)
            return None
        if t >= self.start:  # wrapping window, evening part: ends tomorrow
            return self._at(day, self.start), self._at(day + timedelta(days=1), self.end)
        if t < self.end:  # wrapping window, morning part: started yesterday
            return self._at(day - timedelta(days=1), self.start), self._at(day, self.end)
        return None

    def is_idle(self, now: datetime) -> bool:
        return self._period(now) is not None

    def idle_until(self, now: datetime) -> datetime | None:
        period = self._period(now)
        return period[1] if period else None

    def next_idle_start(self, now: datetime) -> datetime | None:
        period = self._period(now)
        if period is not None:
            now = period[1]  # the next period starts after this one ends
        local = now.astimezone(self.tz)
        candidate = self._at(local.date(), self.start)
        if candidate <= local:
            candidate = self._at(local.date() + timedelta(days=1), self.start)
        return candidate

    def describe(self) -> str:
        return f"sleep hours {self._label}"


class ProxyInactivitySignal(Signal):
    """Idle once no Proxy replica has reported a request for `threshold_minutes`.

    Before any report, the clock time at construction counts as the last activity, so a fresh
    cluster waits one full threshold before it declares the user away.
    """

    name = "proxy_inactivity"

    def __init__(self, threshold_minutes: float, clock: Clock) -> None:
        if threshold_minutes <= 0:
            raise ValueError("threshold_minutes must be > 0")
        self.threshold = timedelta(minutes=threshold_minutes)
        self.last_activity: datetime = clock()

    def report_activity(self, ts: datetime) -> None:
        """Record a request at `ts` (aware). Reports may arrive out of order from many replicas."""
        if ts.tzinfo is None:
            raise ValueError("activity timestamps must be timezone-aware")
        if ts > self.last_activity:
            self.last_activity = ts

    def is_idle(self, now: datetime) -> bool:
        return now - self.last_activity >= self.threshold

    def next_idle_start(self, now: datetime) -> datetime | None:
        # An estimate that assumes no further traffic; only meaningful while the user is active.
        return None if self.is_idle(now) else self.last_activity + self.threshold

    def describe(self) -> str:
        minutes = self.threshold.total_seconds() / 60
        return f"no proxy traffic for {minutes:g} min (last {self.last_activity.isoformat()})"


_IOREG_IDLE = re.compile(r'"HIDIdleTime"\s*=\s*(\d+)')
Runner = Callable[[list[str]], str]  # runs argv, returns stdout, raises on failure


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=5, check=True).stdout


class OSIdleSignal(Signal):
    """Keyboard/mouse idle on the machine this runs on (Linux `xprintidle`, macOS `ioreg`).

    Only meaningful when the OMLS actor runs on the user's own desktop. When the tool is absent or
    fails (no X display, headless node), the signal is off and says so in ONE log line.
    """

    name = "os_idle"

    def __init__(
        self,
        threshold_minutes: float,
        platform: str = sys.platform,
        which: Callable[[str], str | None] = shutil.which,
        run: Runner = _run,
    ) -> None:
        if threshold_minutes <= 0:
            raise ValueError("threshold_minutes must be > 0")
        self.threshold_s = threshold_minutes * 60
        self._run = run
        self._argv = self._command(platform, which)
        self._failed_logged = False

    def _command(self, platform: str, which: Callable[[str], str | None]) -> list[str] | None:
        tool = "ioreg" if platform == "darwin" else "xprintidle" if platform.startswith("linux") else None
        if tool is None or which(tool) is None:
            logger.warning(
                "OMLS os_idle signal off: %s not available on %s", tool or "no idle tool", platform
            )
            return None
        return ["ioreg", "-c", "IOHIDSystem"] if tool == "ioreg" else ["xprintidle"]

    @property
    def available(self) -> bool:
        return self._argv is not None

    def idle_seconds(self) -> float | None:
        """Seconds since the last keyboard/mouse input, or None when unknown."""
        if self._argv is None:
            return None
        try:
            out = self._run(self._argv)
            if self._argv[0] == "xprintidle":
                return int(out.strip()) / 1000.0  # milliseconds
            match = _IOREG_IDLE.search(out)
            if match is None:
                raise ValueError("HIDIdleTime not found in ioreg output")
            return int(match.group(1)) / 1e9  # nanoseconds
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            if not self._failed_logged:  # one line, not one per poll
                logger.warning("OMLS os_idle signal off: %s failed: %s", self._argv[0], e)
                self._failed_logged = True
            return None

    def is_idle(self, now: datetime) -> bool:
        seconds = self.idle_seconds()
        return seconds is not None and seconds >= self.threshold_s

    def describe(self) -> str:
        if self._argv is None:
            return "OS input idle: off (no idle tool)"
        return f"OS input idle for {self.threshold_s / 60:g} min via {self._argv[0]}"
