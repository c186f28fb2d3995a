"""Durable session store and turn outbox shared by every Proxy replica: SQLite (WAL) on one host, or
PostgreSQL when `state.dsn` is set (replicas on several hosts; core/db.py).

A main turn is stored `pending` until its *next state* arrives or its conversation ends; then it is
`completed`, i.e. in the outbox. Rules (serve/history.py says how requests are matched to turns):
- A pending turn is completed only by a request whose history contains its exchange (the messages it
  answered and its reply); its next state is what follows its reply there, up to the next assistant
  message. One exchange completes one turn: of identical pending exchanges the oldest goes first.
- n > 1 choices share a turn index: when the client continues one member, its still pending siblings are
  completed with no next state (the group is scored whole; no feedback belongs to them).
- A client retry (the same request as a pending turn: conversation and parameters) replaces that turn
  under its turn index: the client continues from the reply it got last (the one recorded last). No
  second turn, no feedback shifted.
- `X-Session-Done` / the end route complete every pending turn of the session as ended
  (`last_in_session`); the idle timeout completes a turn pending for `idle_s` as *idle-flushed*
  (`last_in_session` and `idle_flushed`: its conversation went quiet, the session did not end).
A dispatcher claims completed turns with a lease, hands them to the scoring sink and marks them
`dispatched` only when the sink acknowledged; a crash before that re-delivers them. A turn whose scoring
failed because of the turn itself `max_failures` times becomes a dead letter (`dead`, with its error):
never re-sent automatically, listed, requeued or dropped by `clawray dlq`.

NOTE: SQLite runs WAL with synchronous=NORMAL: a committed turn survives a process kill (kill -9), not a
power cut. PostgreSQL commits are durable when acknowledged (synchronous_commit=on, its default).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

from core.config import StateConfig
from core.contracts import Turn
from core.state import open_database
from serve import skill_blocks
from serve.history import History
from serve.turn_payload import payload_json, turn_line

DB_FILE = "sessions.db"  # under the storage root's sessions/ folder
SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, turns INTEGER NOT NULL DEFAULT 0,
  last_seen REAL NOT NULL, done INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS turns (
  turn_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, turn_index INTEGER NOT NULL,
  state TEXT NOT NULL, payload TEXT NOT NULL, updated_at REAL NOT NULL,
  claimed_until REAL NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
  next_state TEXT, ended INTEGER NOT NULL DEFAULT 0, request_key TEXT, turn_key TEXT,
  idle INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0, last_error TEXT,
  block_ref TEXT, block_at TEXT);
CREATE TABLE IF NOT EXISTS blocks (ref TEXT PRIMARY KEY, text TEXT NOT NULL, last_used REAL NOT NULL);
CREATE TABLE IF NOT EXISTS payloads (turn_id TEXT PRIMARY KEY, payload TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns(session_id, state);
CREATE INDEX IF NOT EXISTS turns_by_state ON turns(state, claimed_until);
"""
# Columns added after the first release: (name, definition) for ALTER TABLE on older files.
# request_key / turn_key: serve/history.py keys (hex), so matching a turn never needs its payload.
# block_ref / block_at: the skills block cut out of the payload's messages and where (serve/skill_blocks.py).
# A turn's payload (its JSON, ~10 KB with the prompt ids) lives in `payloads`, written once: SQLite rewrites a
# whole row on every UPDATE, and a turn's state changes three times after its insert (completed, leased,
# dispatched). Rows stored before that keep it in turns.payload ('' for the others).
ADDED_COLUMNS = (("next_state", "TEXT"), ("ended", "INTEGER NOT NULL DEFAULT 0"), ("request_key", "TEXT"),
                 ("turn_key", "TEXT"), ("idle", "INTEGER NOT NULL DEFAULT 0"),
                 ("failures", "INTEGER NOT NULL DEFAULT 0"), ("last_error", "TEXT"), ("block_ref", "TEXT"),
                 ("block_at", "TEXT"))
BLOCK_TOUCH_S = 60.0  # a block's last_used is refreshed at most this often (pruning keeps a day of them)
MAX_ERROR_CHARS = 2000


class TurnLine(NamedTuple):
    """A claimed turn as its JSON (`SessionStore.claim_lines`)."""

    turn_id: str
    json: str


class SessionStore:
    """All methods are blocking and thread-safe; async callers use `asyncio.to_thread`.

    Backends (core/db.py): the SQLite file `path` (embedded default: Proxy replicas of one host share it)
    or PostgreSQL when `state` has a dsn (replicas on several hosts). On PostgreSQL, recording takes an
    advisory lock per session (two replicas recording turns of one session serialise; other sessions do
    not wait) and claims use FOR UPDATE SKIP LOCKED (dispatchers on several hosts take disjoint turns)."""

    def __init__(self, path: Path, state: StateConfig | dict | None = None, storage_root: Path | None = None):
        self.path = path
        cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
        self._db = open_database(cfg, path, "sessions", synchronous="NORMAL", storage_root=storage_root)
        self._db.schema(SCHEMA, {"turns": ADDED_COLUMNS})

    @property
    def backend(self) -> str:
        return self._db.describe()

    def close(self) -> None:
        self._db.close()

    def defer_checkpoints(self) -> bool:
        """SQLite: commits stop checkpointing the WAL (up to a backstop); the caller runs `checkpoint`
        periodically, off its request path (serve/outbox.py `Dispatcher`). False where there is nothing to
        defer (PostgreSQL)."""
        defer = getattr(self._db, "defer_checkpoints", None)
        if defer is None:
            return False
        defer()
        return True

    def checkpoint(self) -> None:
        """Copy the WAL's committed pages into the SQLite file without blocking anyone (a no-op elsewhere)."""
        run = getattr(self._db, "checkpoint", None)
        if run is not None:
            run()

    def _tx(self, *locks: str):
        return self._db.tx(*locks)

    def record(self, turns: list[Turn], history: History | None = None, block: str = "",
               prompt: bytes | None = None) -> list[Turn]:
        """Store the main turn(s) of one request (n > 1 choices share a `group_id` and an index) and
        complete the pending turns its `history` continues (module rules). Assigns `turn_index`.
        `block`: the skills block injected into the request's messages, stored once for all turns that
        carry it (serve/skill_blocks.py); reading gives the messages back whole.
        `prompt`: the turns' prompt ids as one JSON array of ints (the Proxy's: serve/turns.py), stored as
        every turn's `prompt_ids` in place of their own, which are then empty (the turns returned keep
        them empty; every turn read back has them)."""
        return self.record_batch([(turns, history, block, prompt)])[0]

    def record_batch(self, items: list[tuple]) -> list[list[Turn]]:
        """`record` for several requests in ONE transaction (group commit), in order: two requests of
        the same session in one batch chain exactly as if recorded one after the other. Items are
        (turns, history), (turns, history, block) or (turns, history, block, prompt)."""
        now = time.time()
        with self._tx(*(it[0][0].session_id for it in items)) as db:
            return self._record_all(db, items, now)

    def try_record_batch(self, items: list[tuple]) -> list[list[Turn]] | None:
        """`record_batch` if its transaction can begin without waiting, else None (nothing written): an
        event loop records in place when nothing contends (SQLite; ~0.15 ms less than a thread hop) and
        falls back to `record_batch` in a thread. PostgreSQL: always None (a network round trip)."""
        try_tx = getattr(self._db, "try_tx", None)
        if try_tx is None:
            return None
        now = time.time()
        with try_tx() as db:
            if db is None:
                return None
            return self._record_all(db, items, now)

    def _record_all(self, db, items: list[tuple], now: float) -> list[list[Turn]]:
        return [self._record(db, it[0], it[1], now, it[2] if len(it) > 2 else "", it[3] if len(it) > 3 else None)
                for it in items]

    def _record(self, db, turns: list[Turn], history: History | None, now: float, block: str = "",
                prompt: bytes | None = None) -> list[Turn]:
        first = turns[0]
        sid = first.session_id
        pending = db.execute(  # indexed (turns_by_session); a handful of rows per session
            "SELECT turn_id, turn_index, request_key, turn_key FROM turns WHERE session_id=? AND state='pending' "
            "ORDER BY turn_index", (sid,)).fetchall()
        left = _continue(db, pending, history, now)
        retried = [r for r in left if history is not None and r[2] == history.request_key]
        if retried:  # the retry's turn takes the replaced turn's index (all of its choices go)
            db.executemany("DELETE FROM turns WHERE turn_id=?", [(r[0],) for r in retried])
            db.executemany("DELETE FROM payloads WHERE turn_id=?", [(r[0],) for r in retried])
            left = [r for r in left if r not in retried]
        row = db.execute("SELECT turns FROM sessions WHERE session_id=?", (sid,)).fetchone()
        count = row[0] if row else 0
        index = retried[0][1] if retried else count
        db.execute(
            "INSERT INTO sessions(session_id, tenant, turns, last_seen, done) VALUES(?,?,?,?,?) "
            "ON CONFLICT(session_id) DO UPDATE SET turns=excluded.turns, "
            "last_seen=excluded.last_seen, done=excluded.done",
            (sid, first.tenant, max(count, index + 1), now, int(first.last_in_session)),
        )
        if first.last_in_session and left:  # the session is over: its other conversations end with it
            _complete(db, [r[0] for r in left], None, now, ended=True)
        request_key = history.request_key if history is not None else None
        ref, at, compact = _store_block(db, first.messages, block, now)  # the choices share their messages
        stored = []
        for turn in turns:
            turn = turn.model_copy(update={"turn_index": index})
            key = history.turn_key(turn.response_text, turn.tool_calls) if history is not None else None
            payload = turn.model_copy(update={"messages": compact}) if ref else turn
            db.execute(
                "INSERT INTO turns(turn_id, session_id, turn_index, state, payload, updated_at, ended, "
                "request_key, turn_key, block_ref, block_at) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                (turn.turn_id, sid, index, "completed" if turn.last_in_session else "pending",
                 "", now, int(turn.last_in_session), request_key, key, ref, at),
            )
            db.execute("INSERT INTO payloads(turn_id, payload) VALUES(?,?)", (turn.turn_id, payload_json(payload, prompt)))
            stored.append(turn)
        return stored

    def end_session(self, session_id: str) -> int:
        """Complete every pending turn of the session as ended (X-Session-Done without a new turn)."""
        now = time.time()
        with self._tx(session_id) as db:
            db.execute("UPDATE sessions SET done=1, last_seen=? WHERE session_id=?", (now, session_id))
            ids = [r[0] for r in db.execute(
                "SELECT turn_id FROM turns WHERE session_id=? AND state='pending'", (session_id,))]
            return _complete(db, ids, None, now, ended=True)

    def flush_idle(self, idle_s: float) -> int:
        """Complete turns pending for `idle_s` seconds as idle-flushed: their next state never came.

        Per turn, not per session: a conversation that went quiet is flushed even while another
        conversation keeps the same session id busy."""
        now = time.time()
        with self._tx() as db:
            return db.execute(
                "UPDATE turns SET state='completed', idle=1, updated_at=? WHERE state='pending' AND updated_at < ?",
                (now, now - idle_s)).rowcount

    def claim(self, limit: int, lease_s: float) -> list[Turn]:
        """Lease up to `limit` completed turns for dispatch (expired leases are claimable again)."""
        rows, texts = self._claim(limit, lease_s)
        return [_turn(*r[1:], texts=texts) for r in rows]

    def claim_lines(self, limit: int, lease_s: float) -> list[TurnLine]:
        """`claim`, each turn as its JSON (serve/turn_payload.py `turn_line`): for a sink that writes turns
        out as they are, without parsing and re-serialising their prompt ids."""
        rows, texts = self._claim(limit, lease_s)
        return [TurnLine(r[0], turn_line(*r[1:], texts=texts)) for r in rows]

    def _claim(self, limit: int, lease_s: float) -> tuple[list[tuple], dict[str, str]]:
        now = time.time()
        with self._tx() as db:
            rows = db.execute(
                f"SELECT turn_id, {TURN_COLUMNS} FROM turns WHERE state='completed' AND claimed_until < ? "
                "ORDER BY updated_at LIMIT ?" + self._db.skip_locked,
                (now, limit),
            ).fetchall()
            if rows:
                ids = [r[0] for r in rows]
                db.execute(
                    f"UPDATE turns SET claimed_until=?, attempts=attempts+1 "
                    f"WHERE turn_id IN ({','.join('?' * len(ids))})",
                    (now + lease_s, *ids),
                )
            rows = _with_payloads(db, rows)
            return rows, _block_texts(db, rows)

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

    def release(self, turn_ids: list[str], retry_in_s: float, error: str | None = None) -> None:
        """A dispatch failed for a reason outside the turns (the scorer is down, slow or unreachable):
        claimable again after `retry_in_s`. The error is kept for inspection; no failure is counted."""
        with self._tx() as db:
            db.executemany(
                "UPDATE turns SET claimed_until=?, last_error=COALESCE(?, last_error) "
                "WHERE turn_id=? AND state='completed'",
                [(time.time() + retry_in_s, _capped(error), t) for t in turn_ids],
            )

    def fail(self, turn_ids: list[str], error: str, retry_in_s: float, max_failures: int) -> int:
        """Scoring failed because of the turns themselves: count a failure each; a turn at `max_failures`
        becomes a dead letter (never re-sent automatically), the others are retried after `retry_in_s`.
        Returns the number of new dead letters."""
        now = time.time()
        with self._tx() as db:
            db.executemany(
                "UPDATE turns SET claimed_until=?, failures=failures+1, last_error=? "
                "WHERE turn_id=? AND state='completed'",
                [(now + retry_in_s, _capped(error), t) for t in turn_ids],
            )
            return db.executemany(  # rowcount of executemany: rows changed over all parameter sets
                "UPDATE turns SET state='dead', updated_at=? WHERE turn_id=? AND state='completed' AND failures>=?",
                [(now, t, max_failures) for t in turn_ids],
            ).rowcount

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """Dead letters, oldest first: {"id", "error", "at", "attempts", "session_id"}."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT turn_id, last_error, updated_at, attempts, session_id FROM turns WHERE state='dead' "
                "ORDER BY updated_at LIMIT ?", (limit,)).fetchall()
        return [{"id": r[0], "error": r[1], "at": r[2], "attempts": r[3], "session_id": r[4]} for r in rows]

    def requeue(self, turn_ids: list[str]) -> int:
        """Dead letters back into the outbox with a fresh failure count. Returns how many were requeued."""
        with self._tx() as db:
            return db.executemany(
                "UPDATE turns SET state='completed', failures=0, claimed_until=0, updated_at=? "
                "WHERE turn_id=? AND state='dead'", [(time.time(), t) for t in turn_ids]).rowcount

    def drop(self, turn_ids: list[str]) -> int:
        """Delete dead letters for good. Returns how many were deleted."""
        with self._tx() as db:
            db.executemany("DELETE FROM payloads WHERE turn_id=? AND turn_id IN "
                           "(SELECT turn_id FROM turns WHERE state='dead')", [(t,) for t in turn_ids])
            return db.executemany("DELETE FROM turns WHERE turn_id=? AND state='dead'",
                                  [(t,) for t in turn_ids]).rowcount

    def prune(self, older_than_s: float) -> int:
        """Forget turns dispatched more than `older_than_s` ago (the scorer holds them now) and ended
        sessions idle as long; keeps the file bounded under daily use. Returns the turns removed."""
        cutoff = time.time() - older_than_s
        with self._tx() as db:
            db.execute("DELETE FROM payloads WHERE turn_id IN (SELECT turn_id FROM turns WHERE state='dispatched' "
                       "AND updated_at < ?)", (cutoff,))
            n = db.execute("DELETE FROM turns WHERE state='dispatched' AND updated_at < ?", (cutoff,)).rowcount
            db.execute("DELETE FROM blocks WHERE last_used < ? AND ref NOT IN "
                       "(SELECT block_ref FROM turns WHERE block_ref IS NOT NULL)", (cutoff,))
            db.execute("DELETE FROM sessions WHERE done=1 AND last_seen < ? AND NOT EXISTS "
                       "(SELECT 1 FROM turns t WHERE t.session_id=sessions.session_id)", (cutoff,))
        return n

    def turns(self, session_id: str | None = None, state: str | None = None) -> list[Turn]:
        q, args = f"SELECT turn_id, {TURN_COLUMNS} FROM turns WHERE 1=1", []
        if session_id is not None:
            q, args = q + " AND session_id=?", [*args, session_id]
        if state is not None:
            q, args = q + " AND state=?", [*args, state]
        with self._tx() as db:
            rows = db.execute(q + " ORDER BY session_id, turn_index", args).fetchall()
            rows = _with_payloads(db, rows)
            texts = _block_texts(db, rows)
        return [_turn(*r[1:], texts=texts) for r in rows]

    def stats(self) -> dict[str, int]:
        with self._tx() as db:
            rows = db.execute("SELECT state, COUNT(*) FROM turns GROUP BY state").fetchall()
            sessions = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        return {"sessions": sessions, **{s: n for s, n in rows}}


TURN_COLUMNS = "payload, next_state, ended, idle, block_ref, block_at"


def _store_block(db, messages: list[dict[str, Any]], block: str, now: float) -> tuple[str | None, str | None, list]:
    """Keep `block` once (its row's last_used refreshed at most every BLOCK_TOUCH_S) and return (ref,
    where it was as JSON, the messages without it); (None, None, messages) when the messages lack it."""
    found = skill_blocks.cut(messages, block)
    if found is None:
        return None, None, messages
    compact, at = found
    ref = skill_blocks.block_ref(block)
    db.execute("INSERT INTO blocks(ref, text, last_used) VALUES(?,?,?) ON CONFLICT(ref) DO UPDATE SET "
               "last_used=excluded.last_used WHERE blocks.last_used < ?", (ref, block, now, now - BLOCK_TOUCH_S))
    return ref, json.dumps(at), compact


def _with_payloads(db, rows: list[tuple]) -> list[tuple]:
    """Rows (turn_id, TURN_COLUMNS...) with the payloads kept in `payloads` filled in."""
    ids = [r[0] for r in rows if not r[1]]
    if not ids:
        return rows
    got: dict[str, str] = {}
    for i in range(0, len(ids), 500):  # bounded IN lists
        chunk = ids[i:i + 500]
        got.update(db.execute(f"SELECT turn_id, payload FROM payloads WHERE turn_id IN ({','.join('?' * len(chunk))})",
                              chunk).fetchall())
    return [(r[0], got[r[0]], *r[2:]) if not r[1] else r for r in rows]


def _block_texts(db, rows: list[tuple]) -> dict[str, str]:
    """The texts of the blocks `rows` (turn_id, TURN_COLUMNS...) refer to."""
    refs = sorted({r[5] for r in rows if r[5]})
    if not refs:
        return {}
    return dict(db.execute(f"SELECT ref, text FROM blocks WHERE ref IN ({','.join('?' * len(refs))})",
                           refs).fetchall())


def _turn(payload: str, next_state: str | None, ended: int, idle: int, block_ref: str | None = None,
          block_at: str | None = None, texts: dict[str, str] | None = None) -> Turn:
    """A stored turn with what completed it (rows completed before these columns existed carry it in
    the payload) and its messages whole again (the skills block pasted back): serve/turn_payload.py
    `turn_line` says how, for this reader and for the file sink alike."""
    return Turn.model_validate_json(turn_line(payload, next_state, ended, idle, block_ref, block_at, texts))


def _capped(error: str | None) -> str | None:
    return None if error is None else error[:MAX_ERROR_CHARS]


def _complete(db, turn_ids: list[str], next_state: list[dict[str, Any]] | None, now: float,
              ended: bool = False) -> int:
    """Pending turns -> completed (in the outbox). The next state goes into its own column: the payload
    is not rewritten on the hot path of every request."""
    nxt = None if next_state is None else json.dumps(next_state)
    return db.executemany(
        "UPDATE turns SET state='completed', next_state=?, ended=?, updated_at=? WHERE turn_id=? AND state='pending'",
        [(nxt, int(ended), now, t) for t in turn_ids]).rowcount


def _continue(db, pending: list[tuple], history: History | None, now: float) -> list[tuple]:
    """Complete the `pending` rows (turn_id, turn_index, request_key, turn_key; by turn index) whose exchange
    `history` continues, and their n > 1 siblings (no next state). Returns the rows still pending."""
    if history is None or not history.continuations:
        return pending
    taken: set[str] = set()  # exchange keys already given to a turn: one continuation, one turn
    continued: set[int] = set()  # turn indexes with a continued member
    left = []
    for row in pending:
        key = row[3]
        if key in history.continuations and key not in taken:
            taken.add(key)
            continued.add(row[1])
            _complete(db, [row[0]], history.continuations[key], now)
        else:
            left.append(row)
    siblings = [r[0] for r in left if r[1] in continued]
    _complete(db, siblings, None, now)
    return [r for r in left if r[1] not in continued]
