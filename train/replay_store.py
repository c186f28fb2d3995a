"""The durable, generation-filtered replay buffer (DESIGN.md invariants "nothing lost", "support/query").

Backends (core/db.py, config `state:`): a SQLite file in WAL mode with `synchronous=FULL` (the embedded
default), or schema `<namespace>_replay` in PostgreSQL (`state.dsn`). `append` returns only after its
transaction is committed (SQLite: and fsynced), so an acknowledged sample survives a process kill (and a
power cut). One row per sample; the full `Sample` is kept as JSON (token ids and engine logprobs exactly
as captured, never re-tokenized).

Several writers. The invariants below were proven under SQLite's single writer. On PostgreSQL, several
processes may write the same buffer (a second Replay after a failover, `clawray dlq`, a migration), so
EVERY write transaction takes the store lock (`db.tx(STORE_LOCK)`, a transaction-scoped advisory lock):
writes are serialised exactly as on SQLite, and under READ COMMITTED each statement sees every write
committed before the lock was granted. The lease's SELECT also carries `FOR UPDATE SKIP LOCKED`: the rows
it picks stay locked until the lease commits, against any writer outside the store lock. Every write
reads the current generation from `meta` inside its transaction (train/replay_tx.py), never from a
value cached by this process, which another process may have moved on. Reads (`states`, `stats`,
`dead_letters`) take no lock.

States (core.contracts.SampleState):
    fresh    trainable, not yet trained, served under some generation (leased only if it is current)
    leased   handed to a training step; `seal` -> sealed, `release` / lease expiry -> fresh (or retired)
    sealed   the step's commit point passed: its update will be applied; `commit` -> trained
    trained  trained on by a committed step
    retired  served under an older skill generation: never trained on, kept for audit
    support  a turn that triggered an evolution: evolver only, never trained on
    masked   all-zero loss mask (and not in a GRPO group): nothing to train, kept for audit
    dead     dead letter: the trainer rejected it (or its JSON no longer parses); `requeue` / `drop`

Support/query separation under overlap. An evolution runs inside a FENCE: `begin_evolution` marks its
failures `support` in one transaction (a leased one loses its lease; trained or sealed ones cannot be
claimed) and records a pending fence; `end_evolution` advances the generation (when S changed) and/or
returns claimed samples the evolution did not use, and drops the fence. A fence that expires (the
evolver died) stops counting. A training step may apply its update only after `seal(lease_id, ids)`
succeeded: every sample still leased by it, of the current generation, and no pending fence. The seal is
the step's linearization point: a sample sealed before an evolution cannot become support, and a sample
claimed or retired before the seal makes the seal (and so the step) fail. Sealed samples never expire
(the weights may already hold them); a run's recovery commits its checkpointed lease and releases the rest.

GRPO groups (Sample.group_id / group_size > 1) are leased whole or not at all: a group is leasable when
all `group_size` members have arrived and every one is fresh and of the current generation. A member
that became support, dead, or stale makes the group unleasable; its siblings wait until the next
generation bump retires them. Grouped samples with a zero loss mask are stored fresh (their rewards
count in the group's mean and std; the loss mask keeps their tokens out of the loss); a whole group
with no trainable member is masked. `batch_size` counts samples; groups are packed first-fit in arrival
order, and a group larger than the batch is leased alone.

The current generation is monotonic: `set_generation(g)` and any appended sample of a newer generation
(a sample served under g proves generation g exists) move it forward and retire older fresh samples.
Leasing is O(batch): on SQLite the index on (state, generation) also orders by the rowid (= arrival
seq), on PostgreSQL a partial index on (generation, seq) of the fresh rows does, so the oldest fresh
samples of the current generation come straight off an index (tests check both query plans); a lease
looks at most `scan_limit(batch_size)` rows (incomplete groups at the head are skipped).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.contracts import Sample, SampleState
from core.db import STORE_LOCK
from train.replay_schema import LEASE_SQL, open_replay_db
from train.replay_tx import CLAIMABLE, ReplayTx, marks, read_generation

STATES: tuple[SampleState, ...] = (
    "fresh", "leased", "sealed", "trained", "retired", "support", "masked", "dead")
ROLLOUT_PREFIX = "ro-"  # group id of a re-sampled group: "ro-" + the sample id whose prompt it answers
FENCE_KEEP_S = 86_400.0  # expired fences are kept this long (end_evolution may still come), then pruned


class ReplayStore:
    """Durable replay buffer: the SQLite file `path`, or PostgreSQL when `state` has a dsn (`path` is then
    unused). Thread-safe; several processes may share a PostgreSQL buffer (module docstring)."""

    def __init__(self, path: str | Path, default_lease_s: float = 600.0, *,
                 state: StateConfig | dict | None = None, storage_root: Path | None = None) -> None:
        self.path = Path(path)
        self.default_lease_s = default_lease_s
        self._db = open_replay_db(self.path, state, storage_root)
        self._lease_sql = LEASE_SQL + self._db.skip_locked

    @property
    def backend(self) -> str:
        return self._db.describe()

    @contextmanager
    def _tx(self, now: float | None = None) -> Iterator[ReplayTx]:
        """One write transaction under the store lock, seeing the generation as committed."""
        with self._db.tx(STORE_LOCK) as c:
            yield ReplayTx(c, time.time() if now is None else now, self._lease_sql)

    # ------------------------------------------------------------------ writes
    def append(self, samples: Iterable[Sample]) -> int:
        """Store `samples` durably; returns how many were new (a re-sent sample_id is ignored).

        Returns only after the transaction is committed (and, on SQLite, fsynced): the caller may then
        acknowledge.
        """
        samples = list(samples)
        with self._tx() as t:
            t.advance(max((s.skill_generation for s in samples), default=-1))
            return t.c.executemany(
                "INSERT INTO samples(sample_id, turn_id, state, generation, created_at, updated_at, payload, "
                "group_id, group_size) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sample_id) DO NOTHING",
                [(s.sample_id, s.turn_id, t.arrival_state(s), s.skill_generation, s.created_at, t.now,
                  s.model_dump_json(), s.group_id, s.group_size) for s in samples],
            ).rowcount

    def set_generation(self, generation: int) -> int:
        """Make `generation` current (monotonic; lower values are ignored). Returns samples retired."""
        with self._tx() as t:
            return t.advance(generation)

    def mark_support(self, ids: Sequence[str]) -> int:
        """Mark samples (by sample_id or turn_id) as support outside an evolution fence (tests, tools).
        Trained, sealed and dead samples are left alone; a leased one loses its lease. Returns rows changed."""
        ids = list(ids)
        if not ids:
            return 0
        with self._tx() as t:
            return t.set_state(t.ids_where(ids, CLAIMABLE), "support")

    # ------------------------------------------------------------------ evolution fence
    def begin_evolution(self, ids: Sequence[str], ttl_s: float) -> tuple[str, list[str]]:
        """Claim `ids` (sample or turn ids) as support and open a fence that expires after `ttl_s`.

        Returns (token, claimed sample ids): the samples that are support now (newly or already).
        Trained or sealed samples cannot be claimed (a committed step cannot be undone), nor dead ones;
        a leased one loses its lease, so the step holding it cannot seal.
        """
        ids, token = list(ids), uuid.uuid4().hex
        with self._tx() as t:
            t.c.execute("DELETE FROM fences WHERE expires_at < ?", (t.now - FENCE_KEEP_S,))
            newly = t.ids_where(ids, CLAIMABLE)
            claimed = t.ids_where(ids, (*CLAIMABLE, "support"))
            if newly:
                t.set_state(newly, "support")
            # Only what THIS evolution turned into support may be handed back by it (end_evolution).
            t.c.execute("INSERT INTO fences(token, created_at, expires_at, claimed) VALUES(?, ?, ?, ?)",
                        (token, t.now, t.now + ttl_s, json.dumps(newly)))
        return token, claimed

    def end_evolution(self, token: str, new_generation: int | None, release_ids: Sequence[str] = ()) -> dict:
        """Close the fence `token`: advance to `new_generation` (if S changed) and return the samples of
        `release_ids` that THIS fence claimed to fresh / retired / masked. One transaction.

        Returns {"retired", "released", "found"} (found: whether the fence still existed).
        """
        with self._tx() as t:
            mine = t.fence_claims(token)
            retired = t.advance(new_generation) if new_generation is not None else 0
            back = t.ids_where([i for i in dict.fromkeys(release_ids) if i in (mine or ())], ("support",))
            released = t.restore(back)
            t.c.execute("DELETE FROM fences WHERE token = ?", (token,))
        return {"retired": retired, "released": released, "found": mine is not None}

    # ------------------------------------------------------------------ leases
    def lease(
        self, batch_size: int, lease_s: float | None = None, *, owner: str | None = None, min_size: int = 1
    ) -> tuple[str | None, list[Sample]]:
        """Lease up to `batch_size` fresh samples of the CURRENT generation, oldest first, groups whole.

        Expired leases are returned first, so a crashed step's samples are re-delivered. Rows whose JSON
        no longer parses go to the dead letters. Returns (lease_id, samples), or (None, []) when fewer
        than `min_size` samples are available.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        with self._tx() as t:
            expires = t.now + (self.default_lease_s if lease_s is None else lease_s)
            t.release_expired()
            picked = t.pick(batch_size)
            if not picked or len(picked) < max(1, min_size):
                return None, []
            lease_id = uuid.uuid4().hex
            seqs = [seq for seq, _ in picked]
            t.c.execute(
                f"UPDATE samples SET state = 'leased', lease_id = ?, lease_expires = ?, updated_at = ? "
                f"WHERE seq IN ({marks(len(seqs))})",
                (lease_id, expires, t.now, *seqs),
            )
            t.c.execute(
                "INSERT INTO leases(lease_id, owner, created_at, expires_at, n) VALUES(?, ?, ?, ?, ?)",
                (lease_id, owner, t.now, expires, len(picked)),
            )
        return lease_id, [s for _, s in picked]

    def seal(self, lease_id: str, sample_ids: Sequence[str]) -> tuple[bool, str]:
        """The step's commit point: (True, "sealed") when every one of `sample_ids` is still leased by
        `lease_id`, of the current generation, and no evolution fence is pending; they become `sealed`
        (never support, never retired). Otherwise (False, why) and nothing changes."""
        ids = list(dict.fromkeys(sample_ids))
        if not ids:
            return False, "no samples"
        with self._tx() as t:
            refused = _seal_refusal(t, lease_id, ids)
            if refused:
                return False, refused
            t.c.execute(
                f"UPDATE samples SET state = 'sealed', lease_expires = NULL, updated_at = ? "
                f"WHERE sample_id IN ({marks(len(ids))})",
                (t.now, *ids),
            )
        return True, "sealed"

    def commit(self, lease_id: str) -> int:
        """Mark the lease's SEALED samples trained (idempotent); rows it holds unsealed go back. Returns
        samples committed (0 if unknown, never sealed, or already committed)."""
        with self._tx() as t:
            n = t.c.execute(
                "UPDATE samples SET state = 'trained', updated_at = ? WHERE lease_id = ? AND state = 'sealed'",
                (t.now, lease_id),
            ).rowcount
            t.return_where("state = 'leased' AND lease_id = ?", (lease_id,))
            t.c.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return n

    def release(self, lease_id: str) -> int:
        """Return a lease's samples without training (fresh, or retired if the generation moved on)."""
        with self._tx() as t:
            n = t.return_where("state IN ('leased', 'sealed') AND lease_id = ?", (lease_id,))
            t.c.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))  # even if nothing was left
            return n

    def release_owner(self, owner: str) -> int:
        """Return every open lease of `owner`, sealed ones too (a run restarting after a crash: what its
        checkpoint holds was committed first). Returns samples freed."""
        with self._tx() as t:
            ids = [r[0] for r in t.c.execute("SELECT lease_id FROM leases WHERE owner = ?", (owner,)).fetchall()]
            n = sum(t.return_where("state IN ('leased', 'sealed') AND lease_id = ?", (i,)) for i in ids)
            t.c.execute("DELETE FROM leases WHERE owner = ?", (owner,))
            return n

    def release_expired(self, now: float | None = None) -> int:
        """Return every expired lease's unsealed samples. Returns samples freed."""
        with self._tx(now) as t:
            return t.release_expired()

    # ------------------------------------------------------------------ dead letters
    def dead_letter(self, sample_ids: Sequence[str], error: str) -> int:
        """Move samples the trainer rejected to the dead letters with `error` (not trained or sealed
        ones; a dead one counts another attempt). Returns samples moved."""
        with self._tx() as t:
            return t.bury(list(sample_ids), error)

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The dead samples, oldest first: {"id", "error", "at", "attempts"}."""
        with self._db.tx() as c:
            rows = c.execute(
                "SELECT d.sample_id, d.error, d.at, d.attempts FROM dead_letters d "
                "JOIN samples s ON s.sample_id = d.sample_id WHERE s.state = 'dead' ORDER BY d.at LIMIT ?",
                (limit,),
            ).fetchall()
        return [{"id": i, "error": e, "at": at, "attempts": n} for i, e, at, n in rows]

    def requeue(self, sample_ids: Sequence[str]) -> int:
        """Dead samples go back to fresh / retired / masked as they would arrive now. Returns how many."""
        with self._tx() as t:
            return t.restore(t.ids_where(list(sample_ids), ("dead",)))

    def drop(self, sample_ids: Sequence[str]) -> int:
        """Delete dead samples for good. Returns how many."""
        with self._tx() as t:
            ids = t.ids_where(list(sample_ids), ("dead",))
            if ids:
                t.c.execute(f"DELETE FROM samples WHERE sample_id IN ({marks(len(ids))})", tuple(ids))
                t.c.execute(f"DELETE FROM dead_letters WHERE sample_id IN ({marks(len(ids))})", tuple(ids))
            return len(ids)

    # ------------------------------------------------------------------ reads
    @property
    def generation(self) -> int:
        """The current generation as committed (by any process)."""
        with self._db.tx() as c:
            return read_generation(c)

    def rollout_candidates(self, limit: int, scan: int | None = None) -> list[Sample]:
        """Fresh samples of the current generation served alone (no group) whose prompt no re-sampled
        group answers yet (train/rollouts.py), newest first, one per distinct prompt, at most `limit`.
        Looks at the newest `scan` such rows (default 16 x limit) only."""
        scan = scan or 16 * limit
        with self._db.tx() as c:
            rows = c.execute(
                "SELECT sample_id, payload FROM samples WHERE state = 'fresh' AND generation = ? "
                "AND group_id IS NULL ORDER BY seq DESC LIMIT ?", (read_generation(c), scan)).fetchall()
            groups = [ROLLOUT_PREFIX + sid for sid, _ in rows]
            done = {g for (g,) in c.execute(
                f"SELECT DISTINCT group_id FROM samples WHERE group_id IN ({marks(len(groups))})", tuple(groups)
            ).fetchall()} if groups else set()
        out: list[Sample] = []
        prompts: set[tuple[int, ...]] = set()
        for sid, payload in rows:
            if ROLLOUT_PREFIX + sid in done:
                continue
            try:
                sample = Sample.model_validate_json(payload)
            except ValueError:
                continue  # a lease dead-letters it; not this reader's business
            key = tuple(sample.prompt_ids)
            if key not in prompts:
                prompts.add(key)
                out.append(sample)
            if len(out) >= limit:
                break
        return out

    def states(self, sample_ids: Sequence[str]) -> dict[str, SampleState]:
        """The state of each known sample id (audit, tests)."""
        if not sample_ids:
            return {}
        with self._db.tx() as c:
            rows = c.execute(
                f"SELECT sample_id, state FROM samples WHERE sample_id IN ({marks(len(sample_ids))})",
                tuple(sample_ids),
            ).fetchall()
        return {sid: state for sid, state in rows}

    def stats(self) -> dict[str, Any]:
        """Counts by state and by (state, generation), the oldest fresh sample's age, the generation,
        open leases, pending evolution fences and dead letters.

        NOTE: the GROUP BY walks the (state, generation) index, O(buffer) but index-only; it feeds
        status/metrics (throttled), never the training hot path.
        """
        now = time.time()
        with self._db.tx() as c:
            generation = read_generation(c)
            rows = c.execute("SELECT state, generation, COUNT(*) FROM samples GROUP BY state, generation").fetchall()
            oldest = c.execute(
                "SELECT created_at FROM samples WHERE state = 'fresh' AND generation = ? ORDER BY seq LIMIT 1",
                (generation,),
            ).fetchone()
            open_leases = c.execute("SELECT COUNT(*) FROM leases").fetchone()[0]
            fences = c.execute("SELECT COUNT(*) FROM fences WHERE expires_at > ?", (now,)).fetchone()[0]
        by_state = {s: 0 for s in STATES}
        by_gen: dict[str, dict[str, int]] = {}
        for state, gen, n in rows:
            by_state[state] = by_state.get(state, 0) + n
            by_gen.setdefault(str(gen), {})[state] = n
        return {
            "generation": generation,
            "by_state": by_state,
            "by_generation": by_gen,
            "trainable": by_gen.get(str(generation), {}).get("fresh", 0),  # leasable now
            "oldest_fresh_age_s": (now - oldest[0]) if oldest else None,
            "open_leases": open_leases,
            "pending_fences": fences,
            "dead_letters": by_state["dead"],
            "total": sum(by_state.values()),
        }

    def explain_lease(self) -> str:
        """The lease query's plan (tests assert an index serves it in order: no scan, no sort).

        PostgreSQL: sequential scans are disabled for the EXPLAIN, because on a small table the planner
        rightly prefers one whatever the indexes; what is checked is that an index CAN serve the query."""
        with self._db.tx() as c:
            if self._db.dialect == "sqlite":
                plan = c.execute("EXPLAIN QUERY PLAN " + LEASE_SQL, (0, 1)).fetchall()
                return " | ".join(str(r[-1]) for r in plan)
            c.execute("SET LOCAL enable_seqscan = off")
            plan = c.execute("EXPLAIN " + self._lease_sql, (0, 1)).fetchall()
        return " | ".join(r[0].strip() for r in plan)

    def close(self) -> None:
        self._db.close()


def _seal_refusal(t: ReplayTx, lease_id: str, ids: list[str]) -> str | None:
    """Why `ids` cannot be sealed for `lease_id` now, or None (module docstring: the seal)."""
    if t.fence_pending():
        return "an evolution is in progress (its support set and generation are not final)"
    rows = t.c.execute(
        f"SELECT sample_id, state, lease_id, generation FROM samples WHERE sample_id IN ({marks(len(ids))})",
        tuple(ids),
    ).fetchall()
    if len(rows) < len(ids):
        return f"{len(ids) - len(rows)} sample(s) unknown"
    for sid, state, lid, _ in rows:
        if state != "leased" or lid != lease_id:
            return f"sample {sid} is {state}, no longer leased by this step"
    for sid, _, _, gen in rows:
        if gen != t.generation:
            return f"sample {sid} was served under generation {gen}, now {t.generation}"
    return None
