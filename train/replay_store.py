"""The durable, generation-filtered replay buffer (DESIGN.md invariants "nothing lost", "support/query").

SQLite in WAL mode with `synchronous=FULL`: `append` returns only after its transaction is committed and
fsynced, so an acknowledged sample survives a process kill (and a power cut). One row per sample; the
full `Sample` is kept as JSON (token ids and engine logprobs exactly as captured, never re-tokenized).

States (core.contracts.SampleState):
    fresh    trainable, not yet trained, served under some generation (leased only if it is current)
    leased   handed to a training step; `commit` -> trained, lease expiry -> fresh (or retired)
    trained  trained on by a committed step
    retired  served under an older skill generation: never trained on, kept for audit
    support  a turn that triggered an evolution: evolver only, never trained on
    masked   all-zero loss mask: nothing to train, kept for audit

The current generation is monotonic: `set_generation(g)` and any appended sample of a newer generation
(a sample served under g proves generation g exists) move it forward and retire older fresh samples.
Leasing is O(batch): the index on (state, generation) also orders by the rowid (= arrival seq), so the
oldest fresh samples of the current generation come straight off the index (tests check the query plan).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from core.contracts import Sample, SampleState

STATES: tuple[SampleState, ...] = ("fresh", "leased", "trained", "retired", "support", "masked")

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
    payload TEXT NOT NULL                    -- Sample JSON
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
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

LEASE_SQL = (
    "SELECT seq, payload FROM samples WHERE state = 'fresh' AND generation = ? ORDER BY seq LIMIT ?"
)


class ReplayStore:
    """Durable replay buffer in one SQLite file. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: str | Path, default_lease_s: float = 600.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.default_lease_s = default_lease_s
        self._lock = threading.Lock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so every call is one explicit transaction.
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # fsync the WAL on every commit: ack == durable
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._generation = int(self._meta("generation", "0"))

    # ------------------------------------------------------------------ helpers
    def _meta(self, key: str, default: str) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def _tx(self) -> _Tx:
        return _Tx(self._db, self._lock, self._reload)

    def _reload(self) -> None:
        """After a rollback: the cached generation may have moved inside the failed transaction."""
        self._generation = int(self._meta("generation", "0"))

    def _retire_older(self, generation: int, now: float) -> int:
        cur = self._db.execute(
            "UPDATE samples SET state = 'retired', updated_at = ? WHERE state = 'fresh' AND generation < ?",
            (now, generation),
        )
        return cur.rowcount

    def _advance(self, generation: int, now: float) -> int:
        """Inside a transaction: move the current generation forward; returns samples retired."""
        if generation <= self._generation:
            return 0
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES('generation', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (str(generation),),
        )
        self._generation = generation
        return self._retire_older(generation, now)

    # ------------------------------------------------------------------ writes
    def append(self, samples: Iterable[Sample]) -> int:
        """Store `samples` durably; returns how many were new (a re-sent sample_id is ignored).

        Returns only after the transaction is committed and fsynced: the caller may then acknowledge.
        """
        samples = list(samples)
        now = time.time()
        with self._tx():
            newest = max((s.skill_generation for s in samples), default=-1)
            self._advance(newest, now)
            added = 0
            for s in samples:
                added += self._db.execute(
                    "INSERT OR IGNORE INTO samples(sample_id, turn_id, state, generation, created_at, "
                    "updated_at, payload) VALUES(?, ?, ?, ?, ?, ?, ?)",
                    (s.sample_id, s.turn_id, self._initial_state(s), s.skill_generation,
                     s.created_at, now, s.model_dump_json()),
                ).rowcount
        return added

    def _initial_state(self, s: Sample) -> SampleState:
        if not s.trainable:
            return "masked"
        return "retired" if s.skill_generation < self._generation else "fresh"

    def set_generation(self, generation: int) -> int:
        """Make `generation` current (monotonic; lower values are ignored). Returns samples retired."""
        with self._tx():
            return self._advance(generation, time.time())

    def mark_support(self, ids: Sequence[str]) -> int:
        """Mark samples (by sample_id or turn_id) as support: never trained on. Returns rows changed.

        Already-trained samples stay `trained` (a committed step cannot be undone); a leased one loses its
        lease, so the step that holds it will not commit it.
        """
        ids = list(ids)
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        with self._tx():
            return self._db.execute(
                f"UPDATE samples SET state = 'support', lease_id = NULL, lease_expires = NULL, "
                f"updated_at = ? WHERE state != 'trained' AND state != 'support' "
                f"AND (sample_id IN ({marks}) OR turn_id IN ({marks}))",
                (time.time(), *ids, *ids),
            ).rowcount

    # ------------------------------------------------------------------ leases
    def lease(
        self, batch_size: int, lease_s: float | None = None, *, owner: str | None = None, min_size: int = 1
    ) -> tuple[str | None, list[Sample]]:
        """Lease up to `batch_size` fresh samples of the CURRENT generation, oldest first.

        Expired leases are returned first, so a crashed step's samples are re-delivered. Returns
        (lease_id, samples), or (None, []) when fewer than `min_size` samples are available.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        now = time.time()
        expires = now + (self.default_lease_s if lease_s is None else lease_s)
        with self._tx():
            self._release_expired(now)
            rows = self._db.execute(LEASE_SQL, (self._generation, batch_size)).fetchall()
            if len(rows) < max(1, min_size):
                return None, []
            lease_id = uuid.uuid4().hex
            seqs = [r[0] for r in rows]
            self._db.execute(
                f"UPDATE samples SET state = 'leased', lease_id = ?, lease_expires = ?, updated_at = ? "
                f"WHERE seq IN ({','.join('?' * len(seqs))})",
                (lease_id, expires, now, *seqs),
            )
            self._db.execute(
                "INSERT INTO leases(lease_id, owner, created_at, expires_at, n) VALUES(?, ?, ?, ?, ?)",
                (lease_id, owner, now, expires, len(rows)),
            )
        return lease_id, [Sample.model_validate_json(r[1]) for r in rows]

    def commit(self, lease_id: str) -> int:
        """Mark the lease's samples trained (idempotent). Returns samples committed (0 if unknown/expired
        and already returned)."""
        now = time.time()
        with self._tx():
            n = self._db.execute(
                "UPDATE samples SET state = 'trained', lease_expires = NULL, updated_at = ? "
                "WHERE lease_id = ? AND state = 'leased'",
                (now, lease_id),
            ).rowcount
            self._db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return n

    def release(self, lease_id: str) -> int:
        """Return a lease's samples without training (fresh, or retired if the generation moved on)."""
        with self._tx():
            return self._return_where("lease_id = ?", (lease_id,), time.time())

    def release_owner(self, owner: str) -> int:
        """Return every open lease of `owner` (a run restarting after a crash). Returns samples freed."""
        now = time.time()
        with self._tx():
            ids = [r[0] for r in self._db.execute("SELECT lease_id FROM leases WHERE owner = ?", (owner,))]
            return sum(self._return_where("lease_id = ?", (i,), now) for i in ids)

    def release_expired(self, now: float | None = None) -> int:
        """Return every expired lease's samples. Returns samples freed."""
        with self._tx():
            return self._release_expired(time.time() if now is None else now)

    def _release_expired(self, now: float) -> int:
        return self._return_where("state = 'leased' AND lease_expires < ?", (now,), now)

    def _return_where(self, where: str, args: tuple[Any, ...], now: float) -> int:
        """Inside a transaction: leased rows matching `where` go back to fresh or retired."""
        rows = self._db.execute(
            f"SELECT seq, generation, lease_id FROM samples WHERE state = 'leased' AND {where}", args
        ).fetchall()
        for seq, generation, _ in rows:
            state = "fresh" if generation >= self._generation else "retired"
            self._db.execute(
                "UPDATE samples SET state = ?, lease_id = NULL, lease_expires = NULL, updated_at = ? "
                "WHERE seq = ?",
                (state, now, seq),
            )
        for lease_id in {r[2] for r in rows}:
            self._db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return len(rows)

    # ------------------------------------------------------------------ reads
    @property
    def generation(self) -> int:
        return self._generation

    def states(self, sample_ids: Sequence[str]) -> dict[str, SampleState]:
        """The state of each known sample id (audit, tests)."""
        if not sample_ids:
            return {}
        with self._lock:
            rows = self._db.execute(
                f"SELECT sample_id, state FROM samples WHERE sample_id IN ({','.join('?' * len(sample_ids))})",
                tuple(sample_ids),
            ).fetchall()
        return dict(rows)

    def stats(self) -> dict[str, Any]:
        """Counts by state and by (state, generation), the oldest fresh sample's age, the generation.

        NOTE: the GROUP BY walks the (state, generation) index, O(buffer) but index-only; it feeds
        status/metrics (throttled), never the training hot path.
        """
        with self._lock:
            rows = self._db.execute(
                "SELECT state, generation, COUNT(*) FROM samples GROUP BY state, generation"
            ).fetchall()
            oldest = self._db.execute(
                "SELECT created_at FROM samples WHERE state = 'fresh' AND generation = ? ORDER BY seq LIMIT 1",
                (self._generation,),
            ).fetchone()
            open_leases = self._db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]
        by_state = {s: 0 for s in STATES}
        by_gen: dict[str, dict[str, int]] = {}
        for state, gen, n in rows:
            by_state[state] = by_state.get(state, 0) + n
            by_gen.setdefault(str(gen), {})[state] = n
        return {
            "generation": self._generation,
            "by_state": by_state,
            "by_generation": by_gen,
            "trainable": by_gen.get(str(self._generation), {}).get("fresh", 0),  # leasable now
            "oldest_fresh_age_s": (time.time() - oldest[0]) if oldest else None,
            "open_leases": open_leases,
            "total": sum(by_state.values()),
        }

    def explain_lease(self) -> str:
        """EXPLAIN QUERY PLAN of the lease query (tests assert it uses the fresh index, not a scan)."""
        with self._lock:
            plan = self._db.execute("EXPLAIN QUERY PLAN " + LEASE_SQL, (self._generation, 1)).fetchall()
        return " | ".join(str(r[-1]) for r in plan)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Tx:
    """`with store._tx():` = lock + BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, on_rollback) -> None:
        self._db, self._lock, self._on_rollback = db, lock, on_rollback

    def __enter__(self) -> _Tx:
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
