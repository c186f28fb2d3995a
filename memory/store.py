"""The memory store interface (DESIGN.md "State": one small interface per store).

Two implementations, chosen by the `state` config (`memory.open.open_memory_store`):
`SqliteMemoryStore` (memory/sqlite_store.py), the embedded default, SQLite with an FTS5 index; and
`PgMemoryStore` (memory/pg_store.py) when `state.dsn` is set, PostgreSQL with a generated `tsvector`
over the same index terms and a GIN index, BM25 ranked as FTS5 ranks it, vectors as `bytea`, the
change sequence a PostgreSQL sequence. Both pass the same contract tests (tests/unit/test_memory_store.py).

Readers (the Proxy) sync their in-process vector index per scope by a change sequence: every write
stamps the rows it touches, and the scope's row, with a new `seq`; deleted ids are kept as tombstones
(ids only, never content) long enough for readers to catch up, after which a reader that fell behind
reloads the scope.

Vectors are comparable only with vectors of the same encoder (evolve/embedding.py `encoder_id`): the store
records which encoder made its vectors (`vector_encoder`), the writer re-encodes them all when its encoder
differs (`reencode`, memory/index.py `adopt_encoder`), and each catch-up carries the id so a reader never
compares its queries with another encoder's vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from memory.units import Kind, MemoryUnit, Scope


@dataclass(frozen=True)
class InboxEntry:
    """One completed main turn waiting for extraction (what the extractor needs, nothing else)."""

    turn_id: str
    session_id: str
    user: str
    workspace: str
    cap: str  # the turn's X-Memory-Scope: the widest scope its units may go to
    turn_index: int
    created_at: float
    last: bool  # last turn of its session (ended or went idle)
    user_texts: list[str]  # the user messages this turn answered (its new input, not the history)
    assistant_text: str


@dataclass(frozen=True)
class Merge:
    """A new extraction confirmed an existing unit: refresh it, don't add a near duplicate."""

    unit_id: str
    updated_at: float
    confidence: float
    source_turns: list[str]


@dataclass
class Plan:
    """What one ingestion batch writes, applied in one transaction."""

    inserts: list[tuple[MemoryUnit, np.ndarray | None]] = field(default_factory=list)  # (unit, (D,) vec)
    merges: list[Merge] = field(default_factory=list)
    supersessions: list[tuple[str, str]] = field(default_factory=list)  # (old unit id, new unit id)

    def __bool__(self) -> bool:
        return bool(self.inserts or self.merges or self.supersessions)


@dataclass(frozen=True)
class ScopeChanges:
    """A reader's catch-up for one scope since `since` (see the module docstring)."""

    rows: list[tuple[str, str, bytes | None, bool]]  # (unit id, kind, float32 vector bytes or None, active)
    deleted: list[str]  # unit ids deleted since
    seq: int  # the scope's version now
    rebuild: bool  # tombstones older than `since` are gone: drop the cached scope and use `rows` alone
    encoder: str | None = None  # the encoder of the store's vectors (None: not recorded, written before it was)


@dataclass(frozen=True)
class UnitFilter:
    """Which units a listing, export or forget covers (None = any). `user` None = every user."""

    user: str | None = None
    workspace: str | None = None
    session: str | None = None
    level: str | None = None
    kind: Kind | None = None
    include_superseded: bool = False


class MemoryStore(Protocol):
    # ---- ingestion inbox (Memory actor) ----
    def inbox_add(self, entry: InboxEntry) -> bool: ...
    def inbox_pending(self, user: str, workspace: str, session: str) -> list[InboxEntry]: ...
    def inbox_owners(self) -> list[tuple[str, str, str, float, int, int]]: ...
    def forgotten(self, user: str, workspace: str, session: str, created_at: float) -> bool: ...

    # ---- writes (Memory actor; forget/delete also from the CLI and admin routes) ----
    def apply(self, plan: Plan, consumed: list[str]) -> bool: ...
    def slot(self, scope: Scope, kind: Kind, key: str) -> MemoryUnit | None: ...
    def delete_units(self, unit_ids: list[str]) -> int: ...
    def forget(self, user: str, workspace: str | None = None, session: str | None = None) -> int: ...
    def prune(self, max_units_per_scope: int, max_age_s: float | None, now: float) -> int: ...
    def reencode(self, encoder: str, encode: Callable[[list[str]], np.ndarray], batch: int = 256) -> int: ...

    # ---- reads (Proxy, CLI) ----
    def scope_versions(self, keys: list[str]) -> dict[str, int]: ...
    def scope_changes(self, key: str, since: int) -> ScopeChanges: ...
    def vector_encoder(self) -> str | None: ...
    def full_text(self, keys: list[str], query: str, limit: int, max_df: int) -> list[str]: ...
    def fetch(self, unit_ids: list[str], scopes: list[Scope]) -> list[MemoryUnit]: ...
    def fetch_rows(self, unit_ids: list[str], scopes: list[Scope]) -> list[tuple]: ...
    def get(self, unit_id: str) -> MemoryUnit | None: ...
    def history(self, unit_id: str) -> list[MemoryUnit]: ...
    def list_units(self, flt: UnitFilter, limit: int, offset: int = 0) -> list[MemoryUnit]: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
