"""The replay buffer's schema and its migration (train/replay_store.py), on either backend (core/db.py).

The DDL is written for SQLite and translated for PostgreSQL by `core.db`. Opening a buffer written by an
older version adds what it lacks (the GRPO group columns) in place. `open_replay_db` is the one way to
open it (the Replay actor, `clawray dlq`, the demo's audit view and `clawray state migrate` share it).
"""

from __future__ import annotations

from pathlib import Path

from core.config import StateConfig
from core.db import Database
from core.state import open_database

STORE = "replay"  # PostgreSQL schema `<namespace>_replay`

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
ADDED_COLUMNS = {"samples": (("group_id", "TEXT"), ("group_size", "INTEGER NOT NULL DEFAULT 1"))}
# After ADDED_COLUMNS (an older SQLite file has no group_id until then).
_GROUP_INDEX = "CREATE INDEX IF NOT EXISTS ix_group ON samples(group_id) WHERE group_id IS NOT NULL;"
# PostgreSQL only: a B-tree on (state, generation) does not also order by seq (SQLite's index holds the
# rowid = seq), so the lease's ORDER BY seq LIMIT would sort every fresh row; this partial index gives
# the oldest fresh rows of a generation in order, O(batch) as on SQLite.
_PG_LEASE_INDEX = "CREATE INDEX IF NOT EXISTS ix_fresh_seq ON samples(generation, seq) WHERE state = 'fresh';"

LEASE_SQL = (
    "SELECT seq, sample_id, group_id, group_size, payload FROM samples "
    "WHERE state = 'fresh' AND generation = ? ORDER BY seq LIMIT ?"
)


def open_replay_db(path: Path, state: StateConfig | dict | None = None,
                   storage_root: Path | None = None) -> Database:
    """Open (creating or migrating) the buffer: the SQLite file `path` with `synchronous=FULL` (fsync on
    every commit: ack == durable) when `state` has no dsn, else schema `<namespace>_replay` in PostgreSQL
    (acknowledged commits are durable there by default). `storage_root` (SQLite): refused on a network
    file system or when another host owns it (core.state.check_embedded)."""
    cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
    db = open_database(cfg, Path(path), STORE, synchronous="FULL", storage_root=storage_root)
    db.schema(_SCHEMA, ADDED_COLUMNS)
    db.schema(_GROUP_INDEX + (_PG_LEASE_INDEX if db.dialect == "postgresql" else ""))
    return db
