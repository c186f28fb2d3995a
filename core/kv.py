"""`KVStore`: a small versioned key/value store for control state (OMLS, Controller) on core/db.py.

One row per key: `(key, version, value JSON, updated_at)`. `put(key, value, expected_version)` is a
compare-and-swap on the version column: it writes only if the row still has the version the writer last
read (0 = the key must not exist yet) and raises `Conflict` otherwise, so a stale writer (an actor's old
incarnation still running after its restart elsewhere) can never overwrite newer state. `put_latest`
writes unconditionally, for state with one writer by construction.

Each CAS is one statement (`UPDATE ... WHERE version = ?`, or `INSERT ... ON CONFLICT DO NOTHING` for a
new key), so it is atomic on both engines without any lock: on PostgreSQL a second writer waits for the
first's row lock, re-checks the WHERE clause against the committed row and updates nothing.

Embedded default: the SQLite file `<storage root>/control/control.db`; with `state.dsn`: the PostgreSQL
schema `<namespace>_control` (`control_store`). `adopt_json` moves the JSON state file an older release
kept (`control/omls.json`, `control/controller.json`) into the store, once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.state import open_database
from core.storage import StorageLayout, read_json

STORE = "control"  # PostgreSQL schema `<namespace>_control`
CONTROL_FILE = "control.db"  # the embedded default, under the storage root's control/ folder
SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    version INTEGER NOT NULL,       -- 1 on creation, +1 per write: what `put` compares
    value TEXT NOT NULL,            -- JSON
    updated_at REAL NOT NULL        -- epoch seconds of the last write
)"""


class Conflict(RuntimeError):  # noqa: N818 - the name says what happened
    """`put` found another version than the writer expected: someone else wrote since it read."""

    def __init__(self, key: str, expected: int, actual: int | None) -> None:
        found = "no such key" if actual is None else f"version {actual}"
        super().__init__(f"control state {key!r}: expected version {expected}, found {found} "
                         "(another writer changed it since it was read)")
        self.key, self.expected, self.actual = key, expected, actual


class KVStore:
    """Versioned JSON values by key.

    Args:
        path: the SQLite file (unused, and not created, with `state.dsn`).
        state: `StateConfig` (or its dict); None or no dsn = the SQLite file.
        store: the store name (PostgreSQL schema `<namespace>_<store>`).
        storage_root: checked by `core.state.check_embedded` when SQLite is used.
        clock: epoch seconds for `updated_at` (injectable for tests).
    """

    def __init__(self, path: str | Path, state: StateConfig | dict | None = None, *, store: str = STORE,
                 storage_root: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
        self.db = open_database(cfg, Path(path), store, synchronous="FULL", storage_root=storage_root)
        self.db.schema(SCHEMA)
        self.clock = clock

    def get(self, key: str) -> tuple[int, Any] | None:
        """(version, value) of `key`, or None when it was never written."""
        with self.db.tx() as c:
            row = c.execute("SELECT version, value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def put(self, key: str, value: Any, expected_version: int) -> int:
        """Write `value` if `key` is at `expected_version` (0: absent); returns the new version.
        Raises `Conflict` (nothing written) when it is not."""
        doc, now = json.dumps(value), self.clock()
        with self.db.tx() as c:
            if expected_version == 0:
                n = c.execute("INSERT INTO kv(key, version, value, updated_at) VALUES(?, 1, ?, ?) "
                              "ON CONFLICT (key) DO NOTHING", (key, doc, now)).rowcount
            else:
                n = c.execute("UPDATE kv SET version = version + 1, value = ?, updated_at = ? "
                              "WHERE key = ? AND version = ?", (doc, now, key, expected_version)).rowcount
            if n == 1:
                return expected_version + 1
            row = c.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
        raise Conflict(key, expected_version, None if row is None else int(row[0]))

    def put_latest(self, key: str, value: Any) -> int:
        """Write `value` whatever the version (single-writer state); returns the new version."""
        with self.db.tx() as c:
            row = c.execute("INSERT INTO kv(key, version, value, updated_at) VALUES(?, 1, ?, ?) "
                            "ON CONFLICT(key) DO UPDATE SET version = kv.version + 1, value = excluded.value, "
                            "updated_at = excluded.updated_at RETURNING version",
                            (key, json.dumps(value), self.clock())).fetchone()
        return int(row[0])

    def close(self) -> None:
        self.db.close()


def adopt_json(store: KVStore, key: str, legacy: Path) -> tuple[int, Any] | None:
    """(version, value) of `key`; on the first call after an upgrade, the state an older release kept in
    the JSON file `legacy` is moved into the store first (created only if the key is absent, so a racing
    or repeated adoption never overwrites newer state), and the file renamed `<name>.migrated`."""
    got = store.get(key)
    if got is None and legacy.exists():
        try:
            store.put(key, read_json(legacy), 0)
        except Conflict:
            pass  # another incarnation adopted it first: read what it wrote
        got = store.get(key)
    if got is not None and legacy.exists():  # also when a crash came between the write and the rename
        legacy.rename(legacy.with_name(legacy.name + ".migrated"))
    return got


def control_store(storage_root: str | Path, state: StateConfig | dict | None = None) -> KVStore:
    """The control-state store of a storage root: `control/control.db`, or `<namespace>_control` on
    PostgreSQL."""
    root = Path(storage_root)
    return KVStore(StorageLayout(root).control / CONTROL_FILE, state, storage_root=root)
