"""Calendar-busy signals: the user is in a meeting, so the cluster may train.

`ICSCalendarSignal` reads an iCalendar file or URL (`icalendar`; recurring events are expanded with
`recurring-ical-events`). `GoogleCalendarSignal` asks the Google Calendar free/busy API and needs the
optional `google` extra; it imports the Google libraries only when constructed.

Both reduce a calendar to sorted busy intervals and share the interval logic in `CalendarSignal`.
Only timed, opaque, non-cancelled events count: all-day events mark days (holidays, birthdays), not
meetings. A calendar that cannot be read leaves the signal off and says so in one log line.
"""

from __future__ import annotations

import json
import logging
import time as _time
from abc import abstractmethod
from collections.abc import Callable
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from cluster.signals import Signal

logger = logging.getLogger(__name__)

Interval = tuple[datetime, datetime]  # (start, end), aware, start < end
LOOKBEHIND = timedelta(days=1)  # catches long events that started before now
HORIZON = timedelta(days=8)  # far enough for "next window" next week


def merge_intervals(intervals: list[Interval]) -> list[Interval]:
    """Sort and merge overlapping or touching intervals: back-to-back meetings are one busy span."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class CalendarSignal(Signal):
    """Busy-interval logic shared by calendar sources; subclasses fetch the intervals."""

    name = "calendar"

    def __init__(self, refresh_s: float, monotonic: Callable[[], float] = _time.monotonic) -> None:
        self.refresh_s = refresh_s
        self._monotonic = monotonic
        self._cache: list[Interval] = []
        self._cached_at: float | None = None
        self._cache_now: datetime | None = None
        self._failing = False

    @abstractmethod
    def _fetch_intervals(self, start: datetime, end: datetime) -> list[Interval]:
        """Busy intervals overlapping [start, end); raises on a source that cannot be read."""

    def _intervals(self, now: datetime) -> list[Interval]:
        fresh = (
            self._cached_at is not None
            and self._monotonic() - self._cached_at < self.refresh_s
            and self._cache_now is not None
            and self._cache_now - LOOKBEHIND / 2 <= now <= self._cache_now + HORIZON / 2
        )
        if fresh:
            return self._cache
        try:
            self._cache = merge_intervals(self._fetch_intervals(now - LOOKBEHIND, now + HORIZON))
            if self._failing:
                logger.info("OMLS calendar signal back on: %s", self.describe())
            self._failing = False
        # Parsers and HTTP clients raise many types; any one of them means "unreadable".
        except Exception as e:  # noqa: BLE001
            if not self._failing:  # one line per outage, not one per poll
                logger.warning("OMLS calendar signal off: %s: %s", self.describe(), e)
            self._failing = True
            self._cache = []
        self._cached_at, self._cache_now = self._monotonic(), now
        return self._cache

    def _current(self, now: datetime) -> Interval | None:
        return next(((s, e) for s, e in self._intervals(now) if s <= now < e), None)

    def is_idle(self, now: datetime) -> bool:
        return self._current(now) is not None

    def idle_until(self, now: datetime) -> datetime | None:
        current = self._current(now)
        return current[1] if current else None

    def next_idle_start(self, now: datetime) -> datetime | None:
        current = self._current(now)
        after = current[1] if current else now
        return next((s for s, _ in self._intervals(now) if s > after), None)


def _aware(value: datetime | date, tz: ZoneInfo) -> datetime | None:
    """Floating (naive) times are in the scheduler's zone; dates (all-day events) are skipped."""
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=tz) if value.tzinfo is None else value


class ICSCalendarSignal(CalendarSignal):
    """Busy while an event of an iCalendar file or URL (http, https, webcal) covers now.

    Args:
        source: a file path or URL.
        tz: IANA zone for floating event times.
        refresh_s: how long a read (and a URL download) is reused.
        timeout_s: HTTP timeout for URL sources.
        fetch: `fetch(url) -> ics text`; defaults to an httpx GET (injectable for tests).
    """

    def __init__(
        self,
        source: str,
        tz: str = "UTC",
        refresh_s: float = 300.0,
        timeout_s: float = 10.0,
        fetch: Callable[[str], str] | None = None,
        monotonic: Callable[[], float] = _time.monotonic,
    ) -> None:
        super().__init__(refresh_s, monotonic)
        self.source = source
        self.tz = ZoneInfo(tz)
        self.timeout_s = timeout_s
        self._is_url = source.split("://", 1)[0].lower() in ("http", "https", "webcal")
        self._fetch = fetch or self._http_get

    def _http_get(self, url: str) -> str:
        import httpx  # only URL sources need it

        if url.lower().startswith("webcal://"):
            url = "https://" + url[len("webcal://") :]
        response = httpx.get(url, timeout=self.timeout_s, follow_redirects=True)
        response.raise_for_status()
        return response.text

    def _read(self) -> str:
        if self._is_url:
            return self._fetch(self.source)
        return Path(self.source).expanduser().read_text(encoding="utf-8")

    def _fetch_intervals(self, start: datetime, end: datetime) -> list[Interval]:
        import icalendar
        import recurring_ical_events

        calendar = icalendar.Calendar.from_ical(self._read())
        # Query in the local zone so floating events are placed in the user's day.
        events = recurring_ical_events.of(calendar).between(
            start.astimezone(self.tz), end.astimezone(self.tz)
        )
        out: list[Interval] = []
        for event in events:
            if str(event.get("TRANSP", "OPAQUE")).upper() == "TRANSPARENT":
                continue  # "show as free"
            if str(event.get("STATUS", "")).upper() == "CANCELLED":
                continue
            ev_start, ev_end = _aware(event.start, self.tz), _aware(event.end, self.tz)
            if ev_start is not None and ev_end is not None and ev_start < ev_end:
                out.append((ev_start, ev_end))
        return out

    def describe(self) -> str:
        kind = "URL" if self._is_url else "file"
        return f"calendar busy ({kind} {self.source})"


GOOGLE_SCOPES = ["https://www.googleapis.com/auth/calendar.readonly"]


class MissingExtraError(ImportError):
    """An optional dependency group is not installed."""


def _google_service(credentials_file: str):
    """Build a Calendar API client from a service-account or authorized-user JSON file."""
    try:
        from google.oauth2 import credentials as user_credentials
        from google.oauth2 import service_account
        from googleapiclient.discovery import build
    except ImportError as e:
        raise MissingExtraError(
            "Google Calendar support needs the optional 'google' extra: "
            f"pip install -e '.[google]' (missing: {e.name})"
        ) from e
    info = json.loads(Path(credentials_file).expanduser().read_text(encoding="utf-8"))
    if info.get("type") == "service_account":
        creds = service_account.Credentials.from_service_account_info(info, scopes=GOOGLE_SCOPES)
    else:  # a token file written by an OAuth consent flow (type "authorized_user")
        creds = user_credentials.Credentials.from_authorized_user_info(info, scopes=GOOGLE_SCOPES)
    return build("calendar", "v3", credentials=creds, cache_discovery=False)


class GoogleCalendarSignal(CalendarSignal):
    """Busy while Google Calendar's free/busy API reports the calendar busy.

    Args:
        calendar_id: e.g. "primary" or an address the credentials may read.
        credentials_file: service-account JSON, or an authorized-user token JSON.
        refresh_s: how long one free/busy answer is reused.
        service: a prebuilt API client (tests); when None one is built, which needs the `google` extra
            and raises MissingExtraError without it.
    """

    def __init__(
        self,
        calendar_id: str,
        credentials_file: str | None = None,
        refresh_s: float = 300.0,
        service=None,
        monotonic: Callable[[], float] = _time.monotonic,
    ) -> None:
        super().__init__(refresh_s, monotonic)
        if service is None:
            if credentials_file is None:
                raise ValueError("GoogleCalendarSignal needs credentials_file (or a prebuilt service)")
            service = _google_service(credentials_file)
        self.calendar_id = calendar_id
        self._service = service

    def _fetch_intervals(self, start: datetime, end: datetime) -> list[Interval]:
        body = {
            "timeMin": start.isoformat(),
            "timeMax": end.isoformat(),
            "items": [{"id": self.calendar_id}],
        }
        answer = self._service.freebusy().query(body=body).execute()
        calendar = answer.get("calendars", {}).get(self.calendar_id, {})
        if calendar.get("errors"):
            raise RuntimeError(f"free/busy error for {self.calendar_id}: {calendar['errors']}")
        return [
            (datetime.fromisoformat(b["start"]), datetime.fromisoformat(b["end"]))
            for b in calendar.get("busy", [])
        ]

    def describe(self) -> str:
        return f"calendar busy (Google {self.calendar_id})"
