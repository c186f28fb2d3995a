"""Calendar-busy signals on ICS files and a fake Google free/busy client: no network."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cluster.calendars import GoogleCalendarSignal, ICSCalendarSignal, MissingExtraError, merge_intervals
from cluster.omls import OMLS, State

NOW = datetime(2025, 3, 5, 9, 30, tzinfo=UTC)  # a Wednesday

ICS = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//clawray//test//EN
BEGIN:VEVENT
UID:standup
DTSTART:20250101T090000Z
DTEND:20250101T100000Z
RRULE:FREQ=DAILY
SUMMARY:daily standup
END:VEVENT
BEGIN:VEVENT
UID:review
DTSTART:20250305T100000Z
DTEND:20250305T110000Z
SUMMARY:back-to-back review
END:VEVENT
BEGIN:VEVENT
UID:lunch
DTSTART:20250305T120000
DTEND:20250305T130000
SUMMARY:floating lunch
END:VEVENT
BEGIN:VEVENT
UID:free
DTSTART:20250305T150000Z
DTEND:20250305T160000Z
TRANSP:TRANSPARENT
SUMMARY:shown as free
END:VEVENT
BEGIN:VEVENT
UID:holiday
DTSTART;VALUE=DATE:20250306
DTEND;VALUE=DATE:20250307
SUMMARY:all-day
END:VEVENT
END:VCALENDAR
"""


@pytest.fixture
def ics_file(tmp_path):
    path = tmp_path / "cal.ics"
    path.write_text(ICS)
    return path


def test_ics_event_covering_now_is_busy_and_merges_back_to_back(ics_file):
    s = ICSCalendarSignal(str(ics_file), tz="UTC")
    assert s.is_idle(NOW)  # recurring standup 09:00-10:00
    assert s.idle_until(NOW) == datetime(2025, 3, 5, 11, 0, tzinfo=UTC)  # review follows at 10:00
    assert s.next_idle_start(NOW) == datetime(2025, 3, 5, 12, 0, tzinfo=UTC)
    assert not s.is_idle(datetime(2025, 3, 5, 8, 0, tzinfo=UTC))


def test_ics_floating_times_use_scheduler_zone_and_skip_free_and_all_day(ics_file):
    berlin = ZoneInfo("Europe/Berlin")
    s = ICSCalendarSignal(str(ics_file), tz="Europe/Berlin")
    assert s.is_idle(datetime(2025, 3, 5, 12, 30, tzinfo=berlin))  # floating lunch in Berlin time
    assert not s.is_idle(datetime(2025, 3, 5, 12, 30, tzinfo=UTC))  # 13:30 Berlin: lunch is over
    assert not s.is_idle(datetime(2025, 3, 5, 15, 30, tzinfo=UTC))  # TRANSP:TRANSPARENT
    assert not s.is_idle(datetime(2025, 3, 6, 8, 30, tzinfo=UTC))  # all-day event only


def test_ics_meeting_opens_omls_window_with_min_window(ics_file):
    clock = lambda: NOW  # noqa: E731 - a fixed clock
    m = OMLS([ICSCalendarSignal(str(ics_file))], clock, min_window_minutes=60)
    (t,) = m.tick()  # 90 busy minutes left (standup + review) >= 60
    assert t.dst is State.WINDOW_OPEN and m.opened_by == ["calendar"]


def test_ics_missing_file_is_off_with_one_log_line(tmp_path, caplog):
    s = ICSCalendarSignal(str(tmp_path / "nope.ics"), refresh_s=0)
    with caplog.at_level(logging.WARNING, logger="cluster.calendars"):
        assert not s.is_idle(NOW) and not s.is_idle(NOW)
    assert len(caplog.records) == 1 and "calendar signal off" in caplog.records[0].getMessage()


def test_ics_url_is_fetched_once_per_refresh_and_failure_turns_signal_off(caplog):
    calls, ticks = [], [0.0]

    def fetch(url: str) -> str:
        calls.append(url)
        if len(calls) > 1:
            raise OSError("connection refused")
        return ICS

    s = ICSCalendarSignal(
        "https://example.invalid/cal.ics", refresh_s=60, fetch=fetch, monotonic=lambda: ticks[0]
    )
    assert s.is_idle(NOW) and s.is_idle(NOW + timedelta(minutes=1))
    assert len(calls) == 1  # cached
    ticks[0] = 61.0
    with caplog.at_level(logging.WARNING, logger="cluster.calendars"):
        assert not s.is_idle(NOW)
    assert len(calls) == 2 and "connection refused" in caplog.text


def test_merge_intervals_joins_overlaps_and_touching():
    t = lambda h: datetime(2025, 1, 1, h, tzinfo=UTC)  # noqa: E731
    assert merge_intervals([(t(3), t(4)), (t(1), t(2)), (t(2), t(3)), (t(6), t(7))]) == [
        (t(1), t(4)),
        (t(6), t(7)),
    ]


class FakeFreeBusy:
    """Implements the slice of the Google API client the adapter uses: freebusy().query().execute()."""

    def __init__(self, answer: dict) -> None:
        self.answer, self.bodies = answer, []

    def freebusy(self):
        return self

    def query(self, body):
        self.bodies.append(body)
        return self

    def execute(self):
        return self.answer


def test_google_calendar_busy_from_free_busy_answer():
    busy = [{"start": "2025-03-05T09:00:00Z", "end": "2025-03-05T10:00:00Z"}]
    service = FakeFreeBusy({"calendars": {"primary": {"busy": busy}}})
    s = GoogleCalendarSignal("primary", service=service)
    assert s.is_idle(NOW) and s.idle_until(NOW) == datetime(2025, 3, 5, 10, tzinfo=UTC)
    assert service.bodies[0]["items"] == [{"id": "primary"}]


def test_google_calendar_error_answer_turns_signal_off():
    service = FakeFreeBusy({"calendars": {"primary": {"errors": [{"reason": "notFound"}]}}})
    assert not GoogleCalendarSignal("primary", service=service).is_idle(NOW)


def test_google_calendar_without_extra_raises_clear_error(tmp_path, monkeypatch):
    creds = tmp_path / "token.json"
    creds.write_text('{"type": "authorized_user"}')
    monkeypatch.setitem(sys.modules, "googleapiclient", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "googleapiclient.discovery", None)
    with pytest.raises(MissingExtraError, match=r"\.\[google\]"):
        GoogleCalendarSignal("primary", str(creds))
