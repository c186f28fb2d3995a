"""Durable session store and turn outbox (SQLite, WAL) shared by every Proxy replica on a node.

A main turn is stored `pending` until its *next state* arrives (the next request of the session: user
feedback, tool results) or the session ends (`X-Session-Done`, idle timeout); then it is `completed`, i.e.
in the outbox. A dispatcher claims completed turns with a lease, hands them to the scoring sink and marks
them `dispatched` only when the sink acknowledged; a crash before that re-delivers them.

NOTE: WAL with synchronous=NORMAL: a committed turn survives a process kill (kill -9), not a power cut.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from core.contracts import Turn

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0,
  last_seen REAL NOT NULL, done INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS turns (
  turn_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, turn_index INTEGER NOT NULL,
  state TEXT NOT NULL, payload TEXT NOT NULL, updated_at REAL NOT NULL,
  claimed_until REAL NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
  next_state TEXT, ended INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns(session_id, state);
CREATE INDEX IF NOT EXISTS turns_by_state ON turns(state, claimed_until);
"""
# Columns added after the first release: (name, definition) for ALTER TABLE on older files.
ADDED_COLUMNS = (("next_state", "TEXT"), ("ended", "INTEGER NOT NULL DEFAULT 0"))


class SessionStore:
    """All methods are blocking and thread-safe; async callers use `asyncio.to_thread`."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        have = {row[1] for row in self._db.execute("PRAGMA table_info(turns)")}
        for name, definition in ADDED_COLUMNS:
            if name not in have:
                self._db.execute(f"ALTER TABLE turns ADD COLUMN {name} {definition}")
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self):
        return _Tx(self._db, self._lock)

    def record(self, turns: list[Turn], prev_next_state: list[dict[str, Any]] | None) -> list[Turn]:
        """Store the main turn(s) of one request (n > 1 choices share a `group_id` and an index) and
        complete the session's pending turn(s) with `prev_next_state`. Assigns `turn_index`."""
        return self.record_batch([(turns, prev_next_state)])[0]

    def record_batch(
        self, items: list[tuple[list[Turn], list[dict[str, Any]] | None]]
    ) -> list[list[Turn]]:
        """`record` for several requests in ONE transaction (group commit), in order: two requests of
        the same session in one batch chain exactly as if recorded one after the other."""
        now = time.time()
        with self._tx() as db:
            return [self._record(db, turns, nxt, now) for turns, nxt in items]

    def _record(self, db, turns: list[Turn], prev_next_state, now: float) -> list[Turn]:
        first = turns[0]
        row = db.execute("SELECT turns FROM sessions WHERE session_id=?", (first.session_id,)).fetchone()
        index = row[0] if row else 0
        db.execute(
            "INSERT INTO sessions(session_id, tenant, turns, last_seen, done) VALUES(?,?,?,?,?) "
            "ON CONFLICT(session_id) DO UPDATE SET turns=excluded.turns, "
            "last_seen=excluded.last_seen, done=excluded.done",
            (first.session_id, first.tenant, index + 1, now, int(first.last_in_session)),
        )
        self._complete_pending(db, first.session_id, prev_next_state, last=False, now=now)
        stored = []
        for turn in turns:
            turn = turn.model_copy(update={"turn_index": index})
            state = "completed" if turn.last_in_session else "pending"
            db.execute(
                "INSERT INTO turns(turn_id, session_id, turn_index, state, payload, updated_at) "
                "VALUES(?,?,?,?,?,?)",
                (turn.turn_id, turn.session_id, index, state, turn.model_dump_json(), now),
            )
            stored.append(turn)
        return stored

    @staticmethod
    def _complete_pending(db, session_id: str, next_state, last: bool, now: float) -> int:
        """The session's pending turn(s) -> completed, with their next state. The next state goes into
        its own column (the payload is not rewritten: the hot path of every request)."""
        nxt = None if next_state is None else json.dumps(next_state)
        return db.execute(
            "UPDATE turns SET state='completed', next_state=COALESCE(?, next_state), ended=MAX(ended, ?), "
            "updated_at=? WHERE session_id=? AND state='pending'",
            (nxt, int(last), now, session_id),
        ).rowcount

    def end_session(self, session_id: str) -> int:
        """Flush the session's pending turn as its last (X-Session-Done without a new turn)."""
        now = time.time()
        with self._tx() as db:
            db.execute("UPDATE sessions SET done=1, last_seen=? WHERE session_id=?", (now, session_id))
            return self._complete_pending(db, session_id, None, last=True, now=now)

    def flush_idle(self, idle_s: float) -> int:
        """Complete pending turns of sessions idle for `idle_s` seconds (their next state never came)."""
        cutoff = time.time() - idle_s
        with self._tx() as db:
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT DISTINCT session_id FROM turns WHERE state='pending' AND updated_at < ?",
                    (cutoff,),
                ).fetchall()
            ]
            return sum(self._complete_pending(db, s, None, True, time.time()) for s in ids)

    def claim(self, limit: int, lease_s: float) -> list[Turn]:
        """Lease up to `limit` completed turns for dispatch (expired leases are claimable again)."""
        now = time.time()
        with self._tx() as db:
            rows = db.execute(
                f"SELECT turn_id, {TURN_COLUMNS} FROM turns WHERE state='completed' AND claimed_until < ? "
                "ORDER BY updated_at LIMIT ?",
                (now, limit),
            ).fetchall()
            if rows:
                ids = [r[0] for r in rows]
                db.execute(
                    f"UPDATE turns SET claimed_until=?, attempts=attempts+1 "
                    f"WHERE turn_id IN ({','.join('?' * len(ids))})",
                    (now + lease_s, *ids),
                )
        return [_turn(*r[1:]) for r in rows]

    def mark_dispatched(self, turn_ids: list[str]) -> None:
        with self._tx() as db:
            db.executemany(
                "UPDATE turns SET state='dispatched', updated_at=? WHERE turn_id=?",
                [(time.time(), t) for t in turn_ids],
            )

    def extend(self, turn_ids: list[str], lease_s: float) -> None:
        """Renew the lease of turns still being dispatched (the claimer's heartbeat)."""
        with self._tx() as db:
            db.executemany(
                "UPDATE turns SET claimed_until=? WHERE turn_id=? AND state='completed'",
                [(time.time() + lease_s, t) for t in turn_ids],
            )

    def release(self, turn_ids: list[str], retry_in_s: float) -> None:
        """A dispatch failed: make the turns claimable again after `retry_in_s`."""
        with self._tx() as db:
            db.executemany(
                "UPDATE turns SET claimed_until=? WHERE turn_id=? AND state='completed'",
                [(time.time() + retry_in_s, t) for t in turn_ids],
            )

    def prune(self, older_than_s: float) -> int:
        """Forget turns dispatched more than `older_than_s` ago (the scorer holds them now) and ended
        sessions idle as long; keeps the file bounded under daily use. Returns the turns removed."""
        cutoff = time.time() - older_than_s
        with self._tx() as db:
            n = db.execute("DELETE FROM turns WHERE state='dispatched' AND updated_at < ?", (cutoff,)).rowcount
            db.execute("DELETE FROM sessions WHERE done=1 AND last_seen < ? AND NOT EXISTS "
                       "(SELECT 1 FROM turns t WHERE t.session_id=sessions.session_id)", (cutoff,))
        return n

    def turns(self, session_id: str | None = None, state: str | None = None) -> list[Turn]:
        q, args = f"SELECT {TURN_COLUMNS} FROM turns WHERE 1=1", []
        if session_id is not None:
            q, args = q + " AND session_id=?", [*args, session_id]
        if state is not None:
            q, args = q + " AND state=?", [*args, state]
        with self._tx() as db:
            rows = db.execute(q + " ORDER BY session_id, turn_index", args).fetchall()
        return [_turn(*r) for r in rows]

    def stats(self) -> dict[str, int]:
        with self._tx() as db:
            rows = db.execute("SELECT state, COUNT(*) FROM turns GROUP BY state").fetchall()
            sessions = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        return {"sessions": sessions, **{s: n for s, n in rows}}


TURN_COLUMNS = "payload, next_state, ended"


def _turn(payload: str, next_state: str | None, ended: int) -> Turn:
    """A stored turn with what completed it (rows completed before these columns existed carry it in
    the payload)."""
    turn = Turn.model_validate_json(payload)
    update: dict[str, Any] = {}
    if next_state is not None:
        update["next_state"] = json.loads(next_state)
    if ended and not turn.last_in_session:
        update["last_in_session"] = True
    return turn.model_copy(update=update) if update else turn


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT under the store's lock (one writer per process, WAL across them)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.lock.release()
            raise
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()
