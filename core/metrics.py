"""What every plane's `ray.util.metrics` share (the catalogue of clawray's metrics: docs/metrics.md).

- `zero_counter`: counters of rare events exist, at 0, from the start.
- `hold` (`HELD`): every gauge value is set again every few seconds while it holds. Ray (2.60, its OpenTelemetry
  exporter) drops a gauge series that was not set for two export intervals (`metrics_report_interval_ms`,
  10 s by default: 20 s), so a value that does not change (the active adapter overnight, the replay
  buffer's sizes when nobody talks to the agent, the last training step's loss) would vanish from
  Prometheus. A series still goes away when its process does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

REFRESH_S = 5.0  # well under Ray's gauge TTL (20 s with the default 10 s export interval)


def zero_counter(counter: Any, tags: dict[str, str] | None = None) -> Any:
    """Export `counter` (a `ray.util.metrics.Counter`) at 0 now, for `tags` (else its default tags).

    For counters of rare events (dead letters, extraction fallbacks, rejected evolutions): Prometheus sees
    an event only as the change of a series it already has, so a series that first appears at 1 hides
    that event from `increase()` and from alert rules, and a dashboard cannot tell "none yet" from "not
    exported". Ray's public `Counter.inc` refuses 0; `_record` is the call `inc` makes after that check
    (the dashboard test, tests/integration/test_dashboard_metrics.py, sees the zero series scraped).
    """
    counter._record(0, tags=tags)
    return counter


class HeldGauges:
    """The last value of every (gauge, tags) set through it, set again every `refresh_s` by a daemon
    thread (started at the first `set`; one per process)."""

    def __init__(self, refresh_s: float = REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._values: dict[tuple[int, tuple], tuple[Any, float, dict[str, str] | None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def set(self, gauge: Any, value: float, tags: dict[str, str] | None = None) -> None:
        gauge.set(value, tags=tags)
        with self._lock:
            self._values[(id(gauge), tuple(sorted((tags or {}).items())))] = (gauge, value, tags)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="clawray-held-gauges", daemon=True)
                self._thread.start()

    def refresh(self) -> int:
        """Set every held value again; returns how many."""
        with self._lock:
            held = list(self._values.values())
        for gauge, value, tags in held:
            gauge.set(value, tags=tags)
        return len(held)

    def _run(self) -> None:
        while True:
            time.sleep(self.refresh_s)
            self.refresh()


HELD = HeldGauges()


def hold(gauge: Any, value: float, tags: dict[str, str] | None = None) -> None:
    """`gauge.set(value, tags)`, held (see `HeldGauges`). Call this, not `HELD.set`, from Ray actor code: a
    module function is pickled by reference with the actor class, an object holding a lock is not."""
    HELD.set(gauge, value, tags)
