"""`open_memory_store`: the memory store the state config selects (DESIGN.md "State").

`state.dsn` unset (the embedded default): `SqliteMemoryStore`, the file `<memory_dir>/memory.db`, refused
on a network file system or a storage root another host opened (`core.state.check_embedded`, when the
caller names the root). `state.dsn` set: `PgMemoryStore`, schema `<namespace>_memory`, shared by every
host; `memory_dir` is unused then.
"""

from __future__ import annotations

from pathlib import Path

from core.config import StateConfig
from memory.store import MemoryStore


def open_memory_store(memory_dir: str | Path, state: StateConfig | dict | None = None, *,
                      storage_root: str | Path | None = None) -> MemoryStore:
    cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
    if cfg is not None and cfg.dsn:
        from memory.pg_store import PgMemoryStore

        return PgMemoryStore(cfg)
    from memory.sqlite_store import SqliteMemoryStore

    if storage_root is not None:
        from core.state import check_embedded

        check_embedded(Path(storage_root))
    return SqliteMemoryStore.open(Path(memory_dir))
