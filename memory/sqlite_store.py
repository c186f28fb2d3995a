"""`SqliteMemoryStore`: the embedded memory store (SQLite, WAL, FTS5), interface in memory/store.py.

Tables: `units` (every unit, superseded ones kept as history, with its vector as float32 bytes),
`units_fts` (FTS5 over active units only; terms are scope-prefixed, see `memory.text.index_text`),
`scopes` (one row per scope: its version `seq`), `tombstones` (ids of deleted units, for readers),
`inbox` (completed turns waiting for extraction), `forgets` (hashes of forgotten owners and when).

Deletion really deletes: `secure_delete` zeroes freed pages, a forget rewrites the FTS index
(`optimize`: the postings of deleted rows otherwise linger in old segments; it takes about a second per
100k units and blocks this store's other calls meanwhile) and truncates the WAL (when no other
connection is reading it; otherwise its old frames are overwritten as it is reused).

NOTE: one connection per store object, serialised by a lock; every method is blocking (async callers use
`asyncio.to_thread`). SQLite never sits on a network file system (DESIGN.md "State").
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from memory.rows import (
    ENCODER_META,
    INBOX_COLS,
    INBOX_DONE_KEEP_S,
    REENCODE_SELECT,
    REENCODE_UPDATE,
    TOMBSTONE_KEEP_S,
    UNIT_COLS,
    Stale,
    filter_sql,
    forget_target,
    history_chain,
    in_scopes,
    inbox_entry,
    inbox_values,
    marks,
    merged_turns,
    owner_key,
    owner_keys,
    rarest_terms,
    reencoded,
    row_of,
    stats_of,
    unit_of,
)
from memory.store import InboxEntry, Plan, ScopeChanges, UnitFilter
from memory.text import index_text, scope_prefix, terms
from memory.units import Kind, MemoryUnit, Scope

DB_FILE = "memory.db"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS units (
  rid INTEGER PRIMARY KEY, unit_id TEXT NOT NULL UNIQUE, scope_key TEXT NOT NULL, level TEXT NOT NULL,
  user_id TEXT NOT NULL, workspace_id TEXT, session_id TEXT, kind TEXT NOT NULL, key TEXT,
  content TEXT NOT NULL, source_session TEXT NOT NULL, source_turns TEXT NOT NULL,
  created_at REAL NOT NULL, updated_at REAL NOT NULL, confidence REAL NOT NULL, mentions INTEGER NOT NULL,
  supersedes TEXT, superseded_by TEXT, seq INTEGER NOT NULL, vec BLOB);
CREATE INDEX IF NOT EXISTS units_by_scope ON units(scope_key, seq);
CREATE INDEX IF NOT EXISTS units_by_slot ON units(scope_key, kind, key)
  WHERE key IS NOT NULL AND superseded_by IS NULL;
CREATE INDEX IF NOT EXISTS units_by_owner ON units(user_id, workspace_id, session_id);
CREATE INDEX IF NOT EXISTS units_by_source ON units(user_id, source_session);
CREATE TABLE IF NOT EXISTS scopes (
  scope_key TEXT PRIMARY KEY, level TEXT NOT NULL, user_id TEXT NOT NULL, workspace_id TEXT,
  session_id TEXT, seq INTEGER NOT NULL, floor INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS scopes_by_owner ON scopes(user_id, workspace_id, session_id);
CREATE TABLE IF NOT EXISTS tombstones (
  seq INTEGER NOT NULL, scope_key TEXT NOT NULL, unit_id TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS tombstones_by_scope ON tombstones(scope_key, seq);
CREATE TABLE IF NOT EXISTS inbox (
  turn_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, user_id TEXT NOT NULL, workspace_id TEXT NOT NULL,
  cap TEXT NOT NULL, turn_index INTEGER NOT NULL, created_at REAL NOT NULL, last INTEGER NOT NULL,
  payload TEXT NOT NULL, done_at REAL);
CREATE INDEX IF NOT EXISTS inbox_by_owner ON inbox(user_id, workspace_id, session_id, done_at);
CREATE TABLE IF NOT EXISTS forgets (owner_key TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS units_fts USING fts5(
  terms, tokenize='unicode61 remove_diacritics 2', detail=none);
CREATE VIRTUAL TABLE IF NOT EXISTS units_vocab USING fts5vocab(units_fts, 'row');
"""
class SqliteMemoryStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA secure_delete=ON")  # per connection: freed pages are zeroed
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, memory_dir: Path) -> SqliteMemoryStore:
        return cls(memory_dir / DB_FILE)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    @staticmethod
    def _next_seq(db: sqlite3.Connection) -> int:
        row = db.execute("SELECT v FROM meta WHERE k = 'seq'").fetchone()
        seq = (int(row[0]) if row else 0) + 1
        db.execute("INSERT INTO meta(k, v) VALUES ('seq', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                   (str(seq),))
        return seq

    def meta(self, key: str) -> str | None:
        rows = self._read("SELECT v FROM meta WHERE k = ?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                       (key, value))

    # ---- inbox ------------------------------------------------------------------------------------
    def inbox_add(self, e: InboxEntry) -> bool:
        """Queue a turn; False when it was queued before (a re-delivery) or its owner was forgotten after."""
        with self._tx() as db:  # checked in the same transaction: a forget cannot land in between
            if _forgotten(db, e.user, e.workspace, e.session_id, e.created_at):
                return False
            cur = db.execute(f"INSERT OR IGNORE INTO inbox({INBOX_COLS}) VALUES ({marks(9)})", inbox_values(e))
            return cur.rowcount == 1

    def inbox_pending(self, user: str, workspace: str, session: str) -> list[InboxEntry]:
        """The pending turns of one conversation owner, oldest first."""
        rows = self._read(
            f"SELECT {INBOX_COLS} FROM inbox WHERE done_at IS NULL AND user_id = ? AND workspace_id = ? AND "
            "session_id = ? ORDER BY created_at, turn_index", (user, workspace, session))
        return [inbox_entry(r) for r in rows]

    def inbox_owners(self) -> list[tuple[str, str, str, float, int, int]]:
        """Per owner with pending turns: (user, workspace, session, oldest created_at, 1 if its last turn
        is in, count)."""
        return self._read("SELECT user_id, workspace_id, session_id, min(created_at), max(last), count(*) "
                          "FROM inbox WHERE done_at IS NULL GROUP BY user_id, workspace_id, session_id")

    def forgotten(self, user: str, workspace: str, session: str, created_at: float) -> bool:
        """The owner of a turn created at `created_at` was forgotten after it."""
        with self._lock:
            return _forgotten(self._db, user, workspace, session, created_at)

    # ---- writes -----------------------------------------------------------------------------------
    def apply(self, plan: Plan, consumed: list[str]) -> bool:
        """Write `plan` and mark the `consumed` inbox turns done, atomically. False (nothing written)
        when some consumed turn is no longer pending: its owner was forgotten while it was extracted."""
        try:
            with self._tx() as db:
                if consumed:
                    cur = db.execute(f"UPDATE inbox SET done_at = ? WHERE done_at IS NULL AND turn_id IN "
                                     f"({marks(len(consumed))})", (time.time(), *consumed))
                    if cur.rowcount != len(set(consumed)):
                        raise Stale
                if plan:
                    self._write(db, plan)
        except Stale:
            return False
        return True

    def _write(self, db: sqlite3.Connection, plan: Plan) -> None:
        seq = self._next_seq(db)
        for unit, vec in plan.inserts:
            self._touch_scope(db, unit.scope, seq)
            cur = db.execute(
                f"INSERT INTO units({UNIT_COLS}, scope_key, seq, vec) VALUES ({marks(19)})",
                (*row_of(unit), unit.scope.key, seq, None if vec is None else vec.astype("<f4").tobytes()))
            db.execute("INSERT INTO units_fts(rowid, terms) VALUES (?, ?)",
                       (cur.lastrowid, index_text(unit.scope.key, unit.content)))
        for m in plan.merges:
            row = db.execute("SELECT source_turns, scope_key FROM units WHERE unit_id = ?",
                             (m.unit_id,)).fetchone()
            if row is None:
                continue
            db.execute("UPDATE units SET updated_at = max(updated_at, ?), confidence = max(confidence, ?), "
                       "mentions = mentions + 1, source_turns = ?, seq = ? WHERE unit_id = ?",
                       (m.updated_at, m.confidence, merged_turns(row[0], m.source_turns), seq, m.unit_id))
            db.execute("UPDATE scopes SET seq = ? WHERE scope_key = ?", (seq, row[1]))
        for old, new in plan.supersessions:
            row = db.execute("UPDATE units SET superseded_by = ?, seq = ? WHERE unit_id = ? "
                             "RETURNING rid, scope_key", (new, seq, old)).fetchone()
            if row is not None:
                db.execute("DELETE FROM units_fts WHERE rowid = ?", (row[0],))
                db.execute("UPDATE scopes SET seq = ? WHERE scope_key = ?", (seq, row[1]))

    @staticmethod
    def _touch_scope(db: sqlite3.Connection, scope: Scope, seq: int) -> None:
        # A scope created (again, after a forget) starts at `floor = seq`: readers holding an older cache
        # of it must reload rather than catch up.
        db.execute("INSERT INTO scopes(scope_key, level, user_id, workspace_id, session_id, seq, floor) "
                   "VALUES (?,?,?,?,?,?,?) ON CONFLICT(scope_key) DO UPDATE SET seq = excluded.seq",
                   (scope.key, scope.level.value, scope.user, scope.workspace, scope.session, seq, seq))

    def slot(self, scope: Scope, kind: Kind, key: str) -> MemoryUnit | None:
        rows = self._read(f"SELECT {UNIT_COLS} FROM units WHERE scope_key = ? AND kind = ? AND key = ? "
                          "AND superseded_by IS NULL ORDER BY updated_at DESC LIMIT 1",
                          (scope.key, kind.value, key))
        return unit_of(rows[0]) if rows else None

    def delete_units(self, unit_ids: list[str]) -> int:
        """Delete units (and their FTS rows and vectors) for good; readers learn it from tombstones."""
        if not unit_ids:
            return 0
        with self._tx() as db:
            return self._delete_where(db, f"unit_id IN ({marks(len(unit_ids))})", list(unit_ids), set())

    def _delete_where(self, db: sqlite3.Connection, where: str, args: list, dropped_scopes: set[str]) -> int:
        rows = db.execute(f"SELECT rid, unit_id, scope_key FROM units WHERE {where}", args).fetchall()
        if not rows:
            return 0
        seq, now = self._next_seq(db), time.time()
        for i in range(0, len(rows), 500):
            chunk = rows[i:i + 500]
            rids = [r[0] for r in chunk]
            db.execute(f"DELETE FROM units_fts WHERE rowid IN ({marks(len(rids))})", rids)
            db.execute(f"DELETE FROM units WHERE rid IN ({marks(len(rids))})", rids)
        kept = [(seq, key, uid, now) for _, uid, key in rows if key not in dropped_scopes]
        db.executemany("INSERT INTO tombstones(seq, scope_key, unit_id, at) VALUES (?,?,?,?)", kept)
        for key in {k for _, k, _, _ in kept}:
            db.execute("UPDATE scopes SET seq = ? WHERE scope_key = ?", (seq, key))
        return len(rows)

    def forget(self, user: str, workspace: str | None = None, session: str | None = None) -> int:
        """Delete every unit of the owner (a user; a user's workspace; a session, with the units extracted
        from it in wider scopes) and its pending turns, remember (hashed) that it was forgotten, and scrub
        the FTS index and the WAL. Returns the number of units deleted."""
        t = forget_target(user, workspace, session)
        with self._tx() as db:
            dropped = {r[0] for r in db.execute(f"SELECT scope_key FROM scopes WHERE {t.scopes[0]}", t.scopes[1])}
            n = self._delete_where(db, *t.units, dropped)
            db.executemany("DELETE FROM scopes WHERE scope_key = ?", [(k,) for k in dropped])
            db.execute(f"DELETE FROM inbox WHERE {t.inbox[0]}", t.inbox[1])
            db.execute("INSERT INTO forgets(owner_key, at) VALUES (?, ?) ON CONFLICT(owner_key) DO UPDATE "
                       "SET at = excluded.at", (owner_key(*t.owner), time.time()))
        self._scrub()
        return n

    def _scrub(self) -> None:
        with self._lock:
            self._db.execute("INSERT INTO units_fts(units_fts) VALUES ('optimize')")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def prune(self, max_units_per_scope: int, max_age_s: float | None, now: float) -> int:
        """Retention: units older than `max_age_s` go; a scope over `max_units_per_scope` loses its
        superseded history first, then its least recently confirmed units. Old tombstones and consumed
        inbox ids are dropped too. Returns the number of units deleted."""
        gone = 0
        with self._tx() as db:
            if max_age_s is not None:
                gone += self._delete_where(db, "updated_at < ?", [now - max_age_s], set())
            over = db.execute("SELECT scope_key, count(*) - ? FROM units GROUP BY scope_key HAVING count(*) > ?",
                              (max_units_per_scope, max_units_per_scope)).fetchall()
            for key, excess in over:
                gone += self._delete_where(
                    db, "rid IN (SELECT rid FROM units WHERE scope_key = ? ORDER BY superseded_by IS NULL, "
                    "updated_at LIMIT ?)", [key, excess], set())
            cutoff = now - TOMBSTONE_KEEP_S
            db.execute("UPDATE scopes SET floor = max(floor, (SELECT max(t.seq) FROM tombstones t WHERE "
                       "t.scope_key = scopes.scope_key AND t.at < ?)) WHERE scope_key IN (SELECT scope_key FROM "
                       "tombstones WHERE at < ?)", (cutoff, cutoff))
            db.execute("DELETE FROM tombstones WHERE at < ?", (cutoff,))
            db.execute("DELETE FROM inbox WHERE done_at < ?", (now - INBOX_DONE_KEEP_S,))
        return gone

    def reencode(self, encoder: str, encode: Callable[[list[str]], np.ndarray], batch: int = 256) -> int:
        """Replace every stored vector by `encode` of its unit's content and record `encoder`, in one
        transaction (readers keep the old vectors and id until it commits); every scope's floor moves, so
        readers reload each scope whole. Returns the number of vectors re-encoded."""
        with self._tx() as db:
            rows = db.execute(REENCODE_SELECT).fetchall()
            db.executemany(REENCODE_UPDATE, reencoded(rows, encode, batch))
            seq = self._next_seq(db)
            db.execute("UPDATE scopes SET seq = ?, floor = ?", (seq, seq))
            db.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                       (ENCODER_META, encoder))
        return len(rows)

    # ---- reads ------------------------------------------------------------------------------------
    def vector_encoder(self) -> str | None:
        return self.meta(ENCODER_META)

    def scope_versions(self, keys: list[str]) -> dict[str, int]:
        if not keys:
            return {}
        rows = self._read(f"SELECT scope_key, seq FROM scopes WHERE scope_key IN ({marks(len(keys))})", keys)
        return dict(rows)

    def scope_changes(self, key: str, since: int) -> ScopeChanges:
        with self._lock:
            head = self._db.execute("SELECT seq, floor FROM scopes WHERE scope_key = ?", (key,)).fetchone()
            if head is None:
                return ScopeChanges([], [], 0, True)
            seq, floor = head
            enc = self._db.execute("SELECT v FROM meta WHERE k = ?", (ENCODER_META,)).fetchone()
            encoder = enc[0] if enc else None
            if since < floor:  # the tombstones needed to catch up are gone (or the scope was re-created)
                rows = self._db.execute("SELECT unit_id, kind, vec FROM units WHERE scope_key = ? AND "
                                        "superseded_by IS NULL", (key,)).fetchall()
                return ScopeChanges([(u, k, v, True) for u, k, v in rows], [], seq, True, encoder)
            rows = self._db.execute("SELECT unit_id, kind, vec, superseded_by IS NULL FROM units WHERE "
                                    "scope_key = ? AND seq > ?", (key, since)).fetchall()
            dead = self._db.execute("SELECT unit_id FROM tombstones WHERE scope_key = ? AND seq > ?",
                                    (key, since)).fetchall()
        return ScopeChanges([(u, k, v, bool(a)) for u, k, v, a in rows], [d[0] for d in dead], seq, False,
                            encoder)

    def full_text(self, keys: list[str], query: str, limit: int, max_df: int) -> list[str]:
        """Unit ids of the scopes `keys` ranked by BM25 for `query` (best first).

        Terms in more than `max_df` units of a scope are dropped (they rank nothing and their postings
        cost the most), and at most MAX_QUERY_TERMS of the rarest remain, so one search reads a bounded
        number of postings whatever the scope size.
        """
        words = list(dict.fromkeys(terms(query)))[:32]
        tokens = [scope_prefix(k) + w for k in keys for w in words]
        if not tokens or limit <= 0:
            return []
        with self._lock:
            df = self._db.execute(f"SELECT term, doc FROM units_vocab WHERE term IN ({marks(len(tokens))})",
                                  tokens).fetchall()
            keep = rarest_terms(df, max_df)
            if not keep:
                return []
            match = " OR ".join(f'"{t}"' for _, t in keep)
            rows = self._db.execute(
                "SELECT u.unit_id FROM units_fts JOIN units u ON u.rid = units_fts.rowid "
                "WHERE units_fts MATCH ? ORDER BY bm25(units_fts) LIMIT ?", (match, limit)).fetchall()
        return [r[0] for r in rows]

    def fetch(self, unit_ids: list[str], scopes: list[Scope]) -> list[MemoryUnit]:
        """The ACTIVE units among `unit_ids` that belong to one of `scopes` exactly, in `unit_ids` order.

        The isolation check: every id that reaches a prompt passes here, whatever index proposed it.
        """
        return [unit_of(r) for r in self.fetch_rows(unit_ids, scopes)]

    def fetch_rows(self, unit_ids: list[str], scopes: list[Scope]) -> list[tuple]:
        """`fetch` as stored rows (`UNIT_COLS`), for callers that build units only for some of them."""
        if not unit_ids or not scopes:
            return []
        rows = self._read(f"SELECT {UNIT_COLS} FROM units WHERE superseded_by IS NULL AND unit_id IN "
                          f"({marks(len(unit_ids))})", list(unit_ids))
        return in_scopes(rows, unit_ids, scopes)

    def get(self, unit_id: str) -> MemoryUnit | None:
        rows = self._read(f"SELECT {UNIT_COLS} FROM units WHERE unit_id = ?", (unit_id,))
        return unit_of(rows[0]) if rows else None

    def history(self, unit_id: str) -> list[MemoryUnit]:
        """The supersession chain through `unit_id`, oldest first."""
        return history_chain(self.get, unit_id)

    def list_units(self, flt: UnitFilter, limit: int, offset: int = 0) -> list[MemoryUnit]:
        where, args = filter_sql(flt)
        rows = self._read(f"SELECT {UNIT_COLS} FROM units WHERE {where} ORDER BY updated_at DESC, rid DESC "
                          "LIMIT ? OFFSET ?", [*args, limit, offset])
        return [unit_of(r) for r in rows]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            by = self._db.execute("SELECT kind, level, count(*) FROM units WHERE superseded_by IS NULL "
                                  "GROUP BY kind, level").fetchall()
            superseded = self._db.execute("SELECT count(*) FROM units WHERE superseded_by IS NOT NULL"
                                          ).fetchone()[0]
            scopes, users = self._db.execute("SELECT count(*), count(DISTINCT user_id) FROM scopes").fetchone()
            pending, oldest = self._db.execute("SELECT count(*), min(created_at) FROM inbox WHERE done_at IS NULL"
                                               ).fetchone()
        return stats_of(by, superseded, scopes, users, pending, oldest)


def _forgotten(db: sqlite3.Connection, user: str, workspace: str, session: str, created_at: float) -> bool:
    at = db.execute(f"SELECT max(at) FROM forgets WHERE owner_key IN ({marks(3)})",
                    owner_keys(user, workspace, session)).fetchone()[0]
    return at is not None and created_at <= at
