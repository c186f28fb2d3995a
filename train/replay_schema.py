"""The replay buffer's SQLite schema, its migration and its transaction helper (train/replay_store.py).

Opening a buffer written by an older version adds what it lacks (the GRPO group columns) in place.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- arrival order (oldest first when leasing)
    sample_id TEXT NOT NULL UNIQUE,
    turn_id TEXT,
    state TEXT NOT NULL,
    generation INTEGER NOT NULL,             -- skill generation the turn was served under
    created_at REAL NOT NULL,                -- Sample.created_at, epoch seconds
    updated_at REAL NOT NULL,
    lease_id TEXT,
    lease_expires REAL,
    payload TEXT NOT NULL,                   -- Sample JSON
    group_id TEXT,                           -- GRPO group (Sample.group_id), leased whole
    group_size INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS ix_leased ON samples(lease_expires) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS ix_lease_id ON samples(lease_id) WHERE lease_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_turn ON samples(turn_id) WHERE turn_id IS NOT NULL;
-- (state, generation, rowid=seq): leasing reads the oldest fresh rows of one generation in index order
-- (no sort, O(batch)); stats group over it without touching the table.
CREATE INDEX IF NOT EXISTS ix_state_gen ON samples(state, generation);
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY,
    owner TEXT,                              -- e.g. the training run's name
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    n INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fences (          -- evolutions in progress (see the module docstring)
    token TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    claimed TEXT NOT NULL                    -- JSON list of the sample ids this evolution made support
);
CREATE TABLE IF NOT EXISTS dead_letters (
    sample_id TEXT PRIMARY KEY,
    error TEXT NOT NULL,
    at REAL NOT NULL,
    attempts INTEGER NOT NULL                -- times it was dead-lettered (a requeue keeps the count)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_GROUP_COLUMNS = {"group_id": "TEXT", "group_size": "INTEGER NOT NULL DEFAULT 1"}

LEASE_SQL = (
    "SELECT seq, sample_id, group_id, group_size, payload FROM samples "
    "WHERE state = 'fresh' AND generation = ? ORDER BY seq LIMIT ?"
)


def open_db(path: Path) -> sqlite3.Connection:
    """Open (creating or migrating) the buffer at `path`: WAL, `synchronous=FULL` (ack == durable)."""
    # isolation_level=None: we issue BEGIN/COMMIT ourselves so every call is one explicit transaction.
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")  # fsync the WAL on every commit: ack == durable
    db.execute("PRAGMA busy_timeout=5000")
    db.executescript(_SCHEMA)
    have = {r[1] for r in db.execute("PRAGMA table_info(samples)")}
    for col, decl in _GROUP_COLUMNS.items():  # a buffer written before groups were leased whole
        if col not in have:
            db.execute(f"ALTER TABLE samples ADD COLUMN {col} {decl}")
    db.execute("CREATE INDEX IF NOT EXISTS ix_group ON samples(group_id) WHERE group_id IS NOT NULL")
    return db


class Tx:
    """`with store._tx():` = lock + BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, on_rollback) -> None:
        self._db, self._lock, self._on_rollback = db, lock, on_rollback

    def __enter__(self) -> Tx:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._db.execute("COMMIT")
            else:
                self._db.execute("ROLLBACK")
                self._on_rollback()
        finally:
            self._lock.release()
