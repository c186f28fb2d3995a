"""`RunLock`: one training run at a time per storage root, across processes (issue 12 item 3).

Every start of a GRPO run (the Controller's window, `rl` and manual runs, `python -m train.job`) takes
this lock before its trainer starts and gives it back when the run ends. It is a lease in one row of a
small SQLite table, `<storage root>/control/run_lock.db`: who holds it (a description, host, pid), since
when, until when. It is taken in one `BEGIN IMMEDIATE` transaction, so of two processes racing exactly
one wins; the other gets `RunLockBusy`, whose message says "a training run is already running since …"
and names the holder. The holder renews its lease from a heartbeat thread every `ttl_s / 3`. A lease is
stale, and the next start takes it over, when it has expired (the holder hung, or died on another host)
or when its holder's process on this host is gone (a killed Controller: no waiting for the TTL). A
holder whose renewal finds the lease gone (taken over after a long stall) is told through `on_lost`
and must stop training.

Why this makes a run's recovery safe: on (re)start a run returns every Replay lease owned by its run
name (`Replay.release_owner`, train/grpo.py), and every Controller run is named "grpo". Only the holder
of this lock trains, and it took the lock from nobody or from a stale holder, so any other open lease
under that name belongs to a run that is dead, provided its Ray Train workers died with it: before it
trains, `train.job` waits until Ray's actor table shows no live Train actor of the job the lock was
taken from (`RunLease.previous`).

SQLite: the storage root must be a local folder (DESIGN.md, "SQLite never sits on a network file
system"). `acquire` / `renew` / `release` / `current` is the whole interface, the one a PostgreSQL-backed
lock would implement on a cluster.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.storage import StorageLayout

log = logging.getLogger(__name__)

RUN_LOCK_FILE = "run_lock.db"
DEFAULT_TTL_S = 60.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS run_lock (
    id INTEGER PRIMARY KEY CHECK (id = 1),   -- one row: one trainer per storage root
    token TEXT NOT NULL,                     -- this holding; renew/release need it
    holder TEXT NOT NULL,                    -- e.g. "Controller window run 3 (run 'grpo')"
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    since REAL NOT NULL,
    expires REAL NOT NULL,
    info TEXT NOT NULL                       -- JSON: e.g. the holder's Ray job id
)"""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds")


def busy_message(since: float, who: str) -> str:
    """The one answer a refused start gets."""
    return f"a training run is already running since {_iso(since)}: {who}"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    if not Path("/proc/self/stat").exists():
        return True  # no procfs (macOS): the signal probe is all there is
    try:  # field 3 of /proc/<pid>/stat, after the parenthesised command name
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False  # it exited between the two probes


@dataclass(frozen=True)
class Holding:
    """One row of the lock table: who holds (or held) the lock."""

    token: str
    holder: str
    host: str
    pid: int
    since: float
    expires: float
    info: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.holder} (pid {self.pid} on {self.host})"

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "host": self.host, "pid": self.pid, "since": _iso(self.since),
                "expires": _iso(self.expires), "info": dict(self.info)}


class RunLockBusy(RuntimeError):  # noqa: N818 - the name says what the caller is told
    """Another run holds the lock; the message says since when and who."""

    def __init__(self, message: str, holding: Holding | None = None) -> None:
        super().__init__(message)
        self.holding = holding


class RunLock:
    """The lock of one storage root.

    Args:
        path: the SQLite file (`run_lock_for(storage)` gives the standard one).
        ttl_s: how long a lease lives without renewal.
        clock: epoch seconds (injectable for tests).
        is_alive: whether a pid of this host runs (injectable for tests).
    """

    def __init__(self, path: str | Path, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time,
                 is_alive: Callable[[int], bool] = pid_alive) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.path, self.ttl_s, self.clock, self.is_alive = Path(path), ttl_s, clock, is_alive
        self.host = socket.gethostname()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # One short-lived connection per call: safe from any thread; `timeout` waits out a racing writer.
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            yield db
        finally:
            db.close()

    def _row(self, db: sqlite3.Connection) -> Holding | None:
        r = db.execute("SELECT * FROM run_lock WHERE id = 1").fetchone()
        if r is None:
            return None
        return Holding(token=r["token"], holder=r["holder"], host=r["host"], pid=r["pid"], since=r["since"],
                       expires=r["expires"], info=json.loads(r["info"]))

    def is_stale(self, holding: Holding) -> bool:
        """Expired, or held by a process of this host that is gone."""
        if holding.expires < self.clock():
            return True
        return holding.host == self.host and not self.is_alive(holding.pid)

    def acquire(self, holder: str, *, info: dict[str, Any] | None = None, heartbeat: bool = True) -> RunLease:
        """Take the lock for `holder` (a description a refused caller will read), or raise `RunLockBusy`.

        A stale holding is taken over; the returned lease's `previous` is it (None when the lock was free).
        """
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")  # the read and the write below are one step for every process
            previous = self._row(db)
            if previous is not None and not self.is_stale(previous):
                db.execute("ROLLBACK")
                raise RunLockBusy(busy_message(previous.since, previous.describe()), previous)
            now = self.clock()
            mine = Holding(token=uuid.uuid4().hex, holder=holder, host=self.host, pid=os.getpid(), since=now,
                           expires=now + self.ttl_s, info=dict(info or {}))
            db.execute("INSERT OR REPLACE INTO run_lock(id, token, holder, host, pid, since, expires, info) "
                       "VALUES(1, ?, ?, ?, ?, ?, ?, ?)",
                       (mine.token, mine.holder, mine.host, mine.pid, mine.since, mine.expires,
                        json.dumps(mine.info)))
            db.execute("COMMIT")
        if previous is not None:
            log.warning("run lock taken over from stale holder %s", previous.describe())
        return RunLease(self, mine, previous, heartbeat=heartbeat)

    def renew(self, token: str) -> bool:
        """Extend the lease of holding `token`; False when it is no longer the holding."""
        with self._connect() as db:
            n = db.execute("UPDATE run_lock SET expires = ? WHERE id = 1 AND token = ?",
                           (self.clock() + self.ttl_s, token)).rowcount
        return n == 1

    def release(self, token: str) -> bool:
        """Give the lock back; only the holding `token` can (False when it had been taken over)."""
        with self._connect() as db:
            return db.execute("DELETE FROM run_lock WHERE id = 1 AND token = ?", (token,)).rowcount == 1

    def current(self) -> Holding | None:
        """The holding in the table (live or stale), for status output."""
        with self._connect() as db:
            return self._row(db)


class RunLease:
    """A held lock, renewed by a daemon thread until `release()`. `previous`: whom it was taken from."""

    def __init__(self, lock: RunLock, holding: Holding, previous: Holding | None, *, heartbeat: bool) -> None:
        self.lock, self.holding, self.previous = lock, holding, previous
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._on_lost: Callable[[], Any] | None = None
        self._thread = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
            self._thread.start()

    def on_lost(self, callback: Callable[[], Any]) -> None:
        """Call `callback` (it must be idempotent) when the heartbeat finds the lease taken over."""
        self._on_lost = callback
        if self.lost.is_set():
            callback()

    def _beat(self) -> None:
        while not self._stop.wait(self.lock.ttl_s / 3):
            try:
                held = self.lock.renew(self.holding.token)
            except sqlite3.Error as e:  # a busy or briefly unreadable file: the next beat tries again
                log.warning("run lock renewal failed: %s", e)
                continue
            if not held:
                log.error("run lock lost: %s no longer holds it", self.holding.describe())
                self.lost.set()
                if self._on_lost is not None:
                    self._on_lost()
                return

    def release(self) -> None:
        """Stop renewing and give the lock back (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self.lock.release(self.holding.token)

    def __enter__(self) -> RunLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_lock_for(storage: StorageLayout, **kw: Any) -> RunLock:
    """The run lock of a storage root (in its control folder)."""
    return RunLock(storage.control / RUN_LOCK_FILE, **kw)
