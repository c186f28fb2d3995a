"""`RunLock`: one training run at a time per storage root or state database, across processes.

Every start of a GRPO run (the Controller's window, `rl` and manual runs, `python -m train.job`) takes
this lock before its trainer starts and gives it back when the run ends. It is a lease in one row of a
small table (core/db.py): in the embedded default the SQLite file `<storage root>/control/run_lock.db`,
with `state.dsn` the PostgreSQL schema `<namespace>_runlock`, which every host of a cluster shares. The
row says who holds it (a description, host, pid), since when, until when. Of two processes racing
exactly one wins (SQLite: one `BEGIN IMMEDIATE` transaction; PostgreSQL: a compare-and-swap on the
holding's token, see `RunLock.acquire`); the other gets `RunLockBusy`, whose message says "a training run
is already running since …" and names the holder. The holder renews its lease from a heartbeat thread
every `ttl_s / 3`. A lease is stale, and the next start takes it over, when it has expired (the holder
hung, or died on another host) or when its holder's process on this host is gone (a killed Controller:
no waiting for the TTL). A holder whose renewal finds the lease gone (taken over after a long stall) is
told through `on_lost` and must stop training.

Why this makes a run's recovery safe: on (re)start a run returns every Replay lease owned by its run
name (`Replay.release_owner`, train/grpo.py), and every Controller run is named "grpo". Only the holder
of this lock trains, and it took the lock from nobody or from a stale holder, so any other open lease
under that name belongs to a run that is dead, provided its Ray Train workers died with it: before it
trains, `train.job` waits until Ray's actor table shows no live Train actor of the job the lock was
taken from (`RunLease.previous`).

SQLite: the storage root must be a local folder of one host (`core.state.check_embedded` refuses
anything else); a cluster sets `state.dsn`. `acquire` / `renew` / `release` / `current` is the whole
interface, the same on both engines.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.db import Conn, DatabaseError
from core.state import open_database
from core.storage import StorageLayout

log = logging.getLogger(__name__)

RUN_LOCK_FILE = "run_lock.db"  # the embedded default, under the storage root's control/ folder
STORE = "runlock"  # PostgreSQL schema `<namespace>_runlock`
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
COLUMNS = "token, holder, host, pid, since, expires, info"


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
        path: the SQLite file (`run_lock_for(storage)` gives the standard one; unused with `state.dsn`).
        state: `StateConfig` (or its dict); with a dsn the lock is a row in PostgreSQL schema
            `<namespace>_runlock`, shared by every host.
        storage_root: checked by `core.state.check_embedded` when SQLite is used.
        ttl_s: how long a lease lives without renewal.
        clock: epoch seconds (injectable for tests).
        is_alive: whether a pid of this host runs (injectable for tests).
    """

    def __init__(self, path: str | Path, *, state: StateConfig | dict | None = None,
                 storage_root: Path | None = None, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time, is_alive: Callable[[int], bool] = pid_alive) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.ttl_s, self.clock, self.is_alive = ttl_s, clock, is_alive
        self.host = socket.gethostname()
        cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
        self.db = open_database(cfg, Path(path), STORE, storage_root=storage_root)
        self.db.schema(SCHEMA)

    @staticmethod
    def _row(c: Conn) -> Holding | None:
        r = c.execute(f"SELECT {COLUMNS} FROM run_lock WHERE id = 1").fetchone()
        if r is None:
            return None
        token, holder, host, pid, since, expires, info = r
        return Holding(token=token, holder=holder, host=host, pid=int(pid), since=float(since),
                       expires=float(expires), info=json.loads(info))

    def is_stale(self, holding: Holding) -> bool:
        """Expired, or held by a process of this host that is gone."""
        if holding.expires < self.clock():
            return True
        return holding.host == self.host and not self.is_alive(holding.pid)

    @staticmethod
    def _claim(c: Conn, previous: Holding | None, mine: Holding) -> bool:
        """Write `mine` if the row is still `previous` (compare-and-swap on the holding's token, a fresh
        uuid per holding: a lock given back and taken again never shows an old token, so no ABA)."""
        values = (mine.token, mine.holder, mine.host, mine.pid, mine.since, mine.expires, json.dumps(mine.info))
        if previous is None:
            sql = f"INSERT INTO run_lock(id, {COLUMNS}) VALUES(1, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
            return c.execute(sql, values).rowcount == 1
        sql = ("UPDATE run_lock SET token = ?, holder = ?, host = ?, pid = ?, since = ?, expires = ?, info = ? "
               "WHERE id = 1 AND token = ?")
        return c.execute(sql, (*values, previous.token)).rowcount == 1

    def acquire(self, holder: str, *, info: dict[str, Any] | None = None, heartbeat: bool = True) -> RunLease:
        """Take the lock for `holder` (a description a refused caller will read), or raise `RunLockBusy`.

        A stale holding is taken over; the returned lease's `previous` is it (None when the lock was free).
        Of two processes racing for a free or stale lock exactly one wins: SQLite runs the read and the
        write as one `BEGIN IMMEDIATE` transaction; on PostgreSQL the write is a compare-and-swap, and the
        loser reads the winner's holding again and is refused (or, if that one is already stale, retries:
        every lost swap means another taker committed, so this ends).
        """
        with self.db.tx() as c:
            while True:
                previous = self._row(c)
                if previous is not None and not self.is_stale(previous):
                    raise RunLockBusy(busy_message(previous.since, previous.describe()), previous)
                now = self.clock()
                mine = Holding(token=uuid.uuid4().hex, holder=holder, host=self.host, pid=os.getpid(),
                               since=now, expires=now + self.ttl_s, info=dict(info or {}))
                if self._claim(c, previous, mine):
                    break
        if previous is not None:
            log.warning("run lock taken over from stale holder %s", previous.describe())
        return RunLease(self, mine, previous, heartbeat=heartbeat)

    def renew(self, token: str) -> bool:
        """Extend the lease of holding `token`; False when it is no longer the holding."""
        with self.db.tx() as c:
            n = c.execute("UPDATE run_lock SET expires = ? WHERE id = 1 AND token = ?",
                          (self.clock() + self.ttl_s, token)).rowcount
        return n == 1

    def release(self, token: str) -> bool:
        """Give the lock back; only the holding `token` can (False when it had been taken over)."""
        with self.db.tx() as c:
            return c.execute("DELETE FROM run_lock WHERE id = 1 AND token = ?", (token,)).rowcount == 1

    def current(self) -> Holding | None:
        """The holding in the table (live or stale), for status output."""
        with self.db.tx() as c:
            return self._row(c)

    def close(self) -> None:
        self.db.close()


class RunLease:
    """A held lock, renewed by a daemon thread until `release()`. `previous`: whom it was taken from."""

    def __init__(self, lock: RunLock, holding: Holding, previous: Holding | None, *, heartbeat: bool) -> None:
        self.lock, self.holding, self.previous = lock, holding, previous
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._on_lost: Callable[[], Any] | None = None
        self._thread = None
        self._released = False
        self.owns_lock = False  # release() closes `lock` too (set by `acquire_run_lock`)
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
            # A busy file, a dropped connection, a failover: the next beat tries again (within the TTL).
            except (sqlite3.Error, DatabaseError) as e:
                log.warning("run lock renewal failed: %s", e)
                continue
            if not held:
                log.error("run lock lost: %s no longer holds it", self.holding.describe())
                self.lost.set()
                if self._on_lost is not None:
                    self._on_lost()
                return

    def release(self) -> None:
        """Stop renewing and give the lock back (idempotent); closes the lock's database when the lease
        was opened with it (`acquire_run_lock`)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._released:
            return
        self._released = True
        try:
            self.lock.release(self.holding.token)
        finally:
            if self.owns_lock:
                self.lock.close()

    def __enter__(self) -> RunLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_lock_for(storage: StorageLayout, state: StateConfig | dict | None = None, **kw: Any) -> RunLock:
    """The run lock of a storage root: `control/run_lock.db`, or on PostgreSQL (`state.dsn`) the one of
    schema `<namespace>_runlock`, shared by every storage root and host that names the same database."""
    return RunLock(storage.control / RUN_LOCK_FILE, state=state, storage_root=storage.root, **kw)


def acquire_run_lock(storage: StorageLayout, holder: str, state: StateConfig | dict | None = None, *,
                     info: dict[str, Any] | None = None, heartbeat: bool = True, **kw: Any) -> RunLease:
    """Open the run lock, take it (or raise `RunLockBusy`); the lease closes the lock's database (a
    PostgreSQL pool) when it is released, so a process starting many runs leaks no connections."""
    lock = run_lock_for(storage, state, **kw)
    try:
        lease = lock.acquire(holder, info=info, heartbeat=heartbeat)
    except BaseException:
        lock.close()
        raise
    lease.owns_lock = True
    return lease
