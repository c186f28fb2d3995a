"""The durable, generation-filtered replay buffer (DESIGN.md invariants "nothing lost", "support/query").

SQLite in WAL mode with `synchronous=FULL`: `append` returns only after its transaction is committed and
fsynced, so an acknowledged sample survives a process kill (and a power cut). One row per sample; the
full `Sample` is kept as JSON (token ids and engine logprobs exactly as captured, never re-tokenized).

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
Leasing is O(batch): the index on (state, generation) also orders by the rowid (= arrival seq), so the
oldest fresh samples of the current generation come straight off the index (tests check the query plan);
a lease looks at most `scan_limit(batch_size)` rows (incomplete groups at the head are skipped).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.contracts import Sample, SampleState
from train.replay_schema import LEASE_SQL, Tx, open_db

STATES: tuple[SampleState, ...] = (
    "fresh", "leased", "sealed", "trained", "retired", "support", "masked", "dead")
CLAIMABLE = ("fresh", "leased", "retired", "masked")  # what an evolution may turn into support
FENCE_KEEP_S = 86_400.0  # expired fences are kept this long (end_evolution may still come), then pruned


def scan_limit(batch_size: int) -> int:
    """Rows a lease looks at: enough to skip incomplete groups at the head of the queue, still O(batch)."""
    return 4 * batch_size + 256


def _marks(n: int) -> str:
    return ",".join("?" * n)


class ReplayStore:
    """Durable replay buffer in one SQLite file. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: str | Path, default_lease_s: float = 600.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.default_lease_s = default_lease_s
        self._lock = threading.Lock()
        self._db = open_db(self.path)
        self._generation = int(self._meta("generation", "0"))

    # ------------------------------------------------------------------ helpers
    def _meta(self, key: str, default: str) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def _tx(self) -> Tx:
        return Tx(self._db, self._lock, self._reload)

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

    def _arrival_state(self, s: Sample) -> SampleState:
        """Where a sample belongs when it arrives (or comes back from support / the dead letters)."""
        if not s.trainable and (s.group_id is None or s.group_size <= 1):  # a group member stays leasable
            return "masked"
        return "retired" if s.skill_generation < self._generation else "fresh"

    def _fence_pending(self, now: float) -> bool:
        return self._db.execute("SELECT 1 FROM fences WHERE expires_at > ? LIMIT 1", (now,)).fetchone() is not None

    def _ids_where(self, ids: Sequence[str], states: Sequence[str]) -> list[str]:
        """Sample ids (matched by sample_id or turn_id) whose state is one of `states`, in `ids` order."""
        rows = self._db.execute(
            f"SELECT sample_id, turn_id FROM samples WHERE state IN ({_marks(len(states))}) "
            f"AND (sample_id IN ({_marks(len(ids))}) OR turn_id IN ({_marks(len(ids))}))",
            (*states, *ids, *ids),
        ).fetchall()
        order = {x: i for i, x in enumerate(ids)}
        rows.sort(key=lambda r: order.get(r[0], order.get(r[1], 0)))
        return [r[0] for r in rows]

    def _set_state(self, sample_ids: Sequence[str], state: str, now: float) -> int:
        return self._db.execute(
            f"UPDATE samples SET state = ?, lease_id = NULL, lease_expires = NULL, updated_at = ? "
            f"WHERE sample_id IN ({_marks(len(sample_ids))})",
            (state, now, *sample_ids),
        ).rowcount

    def _restore(self, sample_ids: Sequence[str], now: float) -> int:
        """Support or dead rows go back to where they would be now (fresh, retired or masked)."""
        for sid, payload in self._db.execute(
            f"SELECT sample_id, payload FROM samples WHERE sample_id IN ({_marks(len(sample_ids))})",
            tuple(sample_ids),
        ).fetchall():
            self._set_state([sid], self._arrival_state(Sample.model_validate_json(payload)), now)
        return len(sample_ids)

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
                    "updated_at, payload, group_id, group_size) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (s.sample_id, s.turn_id, self._arrival_state(s), s.skill_generation,
                     s.created_at, now, s.model_dump_json(), s.group_id, s.group_size),
                ).rowcount
        return added

    def set_generation(self, generation: int) -> int:
        """Make `generation` current (monotonic; lower values are ignored). Returns samples retired."""
        with self._tx():
            return self._advance(generation, time.time())

    def mark_support(self, ids: Sequence[str]) -> int:
        """Mark samples (by sample_id or turn_id) as support outside an evolution fence (tests, tools).
        Trained, sealed and dead samples are left alone; a leased one loses its lease. Returns rows changed."""
        ids = list(ids)
        if not ids:
            return 0
        with self._tx():
            return self._set_state(self._ids_where(ids, CLAIMABLE), "support", time.time())

    # ------------------------------------------------------------------ evolution fence
    def begin_evolution(self, ids: Sequence[str], ttl_s: float) -> tuple[str, list[str]]:
        """Claim `ids` (sample or turn ids) as support and open a fence that expires after `ttl_s`.

        Returns (token, claimed sample ids): the samples that are support now (newly or already).
        Trained or sealed samples cannot be claimed (a committed step cannot be undone), nor dead ones;
        a leased one loses its lease, so the step holding it cannot seal.
        """
        ids, now = list(ids), time.time()
        token = uuid.uuid4().hex
        with self._tx():
            self._db.execute("DELETE FROM fences WHERE expires_at < ?", (now - FENCE_KEEP_S,))
            newly = self._ids_where(ids, CLAIMABLE) if ids else []
            claimed = self._ids_where(ids, (*CLAIMABLE, "support")) if ids else []
            if newly:
                self._set_state(newly, "support", now)
            self._db.execute("INSERT INTO fences(token, created_at, expires_at, claimed) VALUES(?, ?, ?, ?)",
                             (token, now, now + ttl_s, json.dumps(newly)))
        return token, claimed

    def end_evolution(self, token: str, new_generation: int | None, release_ids: Sequence[str] = ()) -> dict:
        """Close the fence `token`: advance to `new_generation` (if S changed) and return the samples of
        `release_ids` that THIS fence claimed to fresh / retired / masked. One transaction.

        Returns {"retired", "released", "found"} (found: whether the fence still existed).
        """
        now = time.time()
        with self._tx():
            row = self._db.execute("SELECT claimed FROM fences WHERE token = ?", (token,)).fetchone()
            retired = self._advance(new_generation, now) if new_generation is not None else 0
            mine = set(json.loads(row[0])) if row else set()
            back = [i for i in dict.fromkeys(release_ids) if i in mine]
            back = self._ids_where(back, ("support",)) if back else []
            released = self._restore(back, now) if back else 0
            self._db.execute("DELETE FROM fences WHERE token = ?", (token,))
        return {"retired": retired, "released": released, "found": row is not None}

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
        now = time.time()
        expires = now + (self.default_lease_s if lease_s is None else lease_s)
        with self._tx():
            self._release_expired(now)
            picked = self._pick(batch_size, now)
            if not picked or len(picked) < max(1, min_size):
                return None, []
            lease_id = uuid.uuid4().hex
            seqs = [seq for seq, _ in picked]
            self._db.execute(
                f"UPDATE samples SET state = 'leased', lease_id = ?, lease_expires = ?, updated_at = ? "
                f"WHERE seq IN ({_marks(len(seqs))})",
                (lease_id, expires, now, *seqs),
            )
            self._db.execute(
                "INSERT INTO leases(lease_id, owner, created_at, expires_at, n) VALUES(?, ?, ?, ?, ?)",
                (lease_id, owner, now, expires, len(picked)),
            )
        return lease_id, [s for _, s in picked]

    def _pick(self, batch_size: int, now: float) -> list[tuple[int, Sample]]:
        """Inside a transaction: first-fit units (a loose sample, or a whole group) in arrival order."""
        rows = self._db.execute(LEASE_SQL, (self._generation, scan_limit(batch_size))).fetchall()
        picked: list[tuple[int, Sample]] = []
        seen: set[str] = set()
        for seq, sid, gid, gsize, payload in rows:
            if gid is not None and gsize > 1:
                if gid in seen:
                    continue
                seen.add(gid)
                unit = self._whole_group(gid, gsize, now)
            else:
                unit = self._parsed([(seq, sid, payload)], now)
            if not unit or (picked and len(picked) + len(unit) > batch_size):
                continue  # waits for a later lease (it is then the oldest, so it is never starved)
            picked += unit
            if len(picked) >= batch_size:  # also: a group larger than the batch, leased alone
                break
        return picked

    def _whole_group(self, gid: str, size: int, now: float) -> list[tuple[int, Sample]]:
        """The group's members if it is leasable now (all arrived, all fresh and current), else []."""
        rows = self._db.execute(
            "SELECT seq, sample_id, payload, state, generation FROM samples WHERE group_id = ? ORDER BY seq",
            (gid,),
        ).fetchall()
        if len(rows) < size or any(st != "fresh" or g != self._generation for *_, st, g in rows):
            return []
        unit = self._parsed([r[:3] for r in rows], now)
        if len(unit) < len(rows):
            return []
        if not any(s.trainable for _, s in unit):  # nothing to train in the whole group
            self._set_state([s.sample_id for _, s in unit], "masked", now)
            return []
        return unit

    def _parsed(self, rows: Sequence[tuple[int, str, str]], now: float) -> list[tuple[int, Sample]]:
        out = []
        for seq, sid, payload in rows:
            try:
                out.append((seq, Sample.model_validate_json(payload)))
            except ValidationError as e:  # a poison row must not fail every lease forever
                self._bury([sid], f"stored sample does not parse: {e}", now)
        return out

    def seal(self, lease_id: str, sample_ids: Sequence[str]) -> tuple[bool, str]:
        """The step's commit point: (True, "sealed") when every one of `sample_ids` is still leased by
        `lease_id`, of the current generation, and no evolution fence is pending; they become `sealed`
        (never support, never retired). Otherwise (False, why) and nothing changes."""
        ids, now = list(dict.fromkeys(sample_ids)), time.time()
        if not ids:
            return False, "no samples"
        with self._tx():
            if self._fence_pending(now):
                return False, "an evolution is in progress (its support set and generation are not final)"
            rows = self._db.execute(
                f"SELECT sample_id, state, lease_id, generation FROM samples WHERE sample_id IN ({_marks(len(ids))})",
                tuple(ids),
            ).fetchall()
            if len(rows) < len(ids):
                return False, f"{len(ids) - len(rows)} sample(s) unknown"
            for sid, state, lid, _ in rows:
                if state != "leased" or lid != lease_id:
                    return False, f"sample {sid} is {state}, no longer leased by this step"
            for sid, _, _, gen in rows:
                if gen != self._generation:
                    return False, f"sample {sid} was served under generation {gen}, now {self._generation}"
            self._db.execute(
                f"UPDATE samples SET state = 'sealed', lease_expires = NULL, updated_at = ? "
                f"WHERE sample_id IN ({_marks(len(ids))})",
                (now, *ids),
            )
        return True, "sealed"

    def commit(self, lease_id: str) -> int:
        """Mark the lease's SEALED samples trained (idempotent); rows it holds unsealed go back. Returns
        samples committed (0 if unknown, never sealed, or already committed)."""
        now = time.time()
        with self._tx():
            n = self._db.execute(
                "UPDATE samples SET state = 'trained', updated_at = ? WHERE lease_id = ? AND state = 'sealed'",
                (now, lease_id),
            ).rowcount
            self._return_where("state = 'leased' AND lease_id = ?", (lease_id,), now)
            self._db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return n

    def release(self, lease_id: str) -> int:
        """Return a lease's samples without training (fresh, or retired if the generation moved on)."""
        with self._tx():
            n = self._return_where("state IN ('leased', 'sealed') AND lease_id = ?", (lease_id,), time.time())
            self._db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))  # even if nothing was left
            return n

    def release_owner(self, owner: str) -> int:
        """Return every open lease of `owner`, sealed ones too (a run restarting after a crash: what its
        checkpoint holds was committed first). Returns samples freed."""
        now = time.time()
        with self._tx():
            ids = [r[0] for r in self._db.execute("SELECT lease_id FROM leases WHERE owner = ?", (owner,))]
            n = sum(self._return_where("state IN ('leased', 'sealed') AND lease_id = ?", (i,), now) for i in ids)
            self._db.execute("DELETE FROM leases WHERE owner = ?", (owner,))
            return n

    def release_expired(self, now: float | None = None) -> int:
        """Return every expired lease's unsealed samples. Returns samples freed."""
        with self._tx():
            return self._release_expired(time.time() if now is None else now)

    def _release_expired(self, now: float) -> int:
        return self._return_where("state = 'leased' AND lease_expires < ?", (now,), now)

    def _return_where(self, where: str, args: tuple[Any, ...], now: float) -> int:
        """Inside a transaction: rows matching `where` go back to fresh or retired."""
        rows = self._db.execute(f"SELECT seq, generation, lease_id FROM samples WHERE {where}", args).fetchall()
        for seq, generation, _ in rows:
            state = "fresh" if generation >= self._generation else "retired"
            self._db.execute(
                "UPDATE samples SET state = ?, lease_id = NULL, lease_expires = NULL, updated_at = ? "
                "WHERE seq = ?",
                (state, now, seq),
            )
        for lease_id in {r[2] for r in rows}:
            held = self._db.execute("SELECT 1 FROM samples WHERE lease_id = ? AND state IN ('leased', 'sealed') "
                                    "LIMIT 1", (lease_id,)).fetchone()
            if held is None:  # a lease with sealed rows left stays, so its owner's recovery finds them
                self._db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return len(rows)

    # ------------------------------------------------------------------ dead letters
    def dead_letter(self, sample_ids: Sequence[str], error: str) -> int:
        """Move samples the trainer rejected to the dead letters with `error` (not trained or sealed
        ones; a dead one counts another attempt). Returns samples moved."""
        with self._tx():
            return self._bury(list(sample_ids), error, time.time())

    def _bury(self, sample_ids: list[str], error: str, now: float) -> int:
        ids = self._ids_where(sample_ids, (*CLAIMABLE, "support", "dead")) if sample_ids else []
        if not ids:
            return 0
        self._set_state(ids, "dead", now)
        self._db.executemany(
            "INSERT INTO dead_letters(sample_id, error, at, attempts) VALUES(?, ?, ?, 1) ON CONFLICT(sample_id) "
            "DO UPDATE SET error = excluded.error, at = excluded.at, attempts = attempts + 1",
            [(i, error[:2000], now) for i in ids],
        )
        return len(ids)

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The dead samples, oldest first: {"id", "error", "at", "attempts"}."""
        with self._lock:
            rows = self._db.execute(
                "SELECT d.sample_id, d.error, d.at, d.attempts FROM dead_letters d "
                "JOIN samples s ON s.sample_id = d.sample_id WHERE s.state = 'dead' ORDER BY d.at LIMIT ?",
                (limit,),
            ).fetchall()
        return [{"id": i, "error": e, "at": at, "attempts": n} for i, e, at, n in rows]

    def requeue(self, sample_ids: Sequence[str]) -> int:
        """Dead samples go back to fresh / retired / masked as they would arrive now. Returns how many."""
        with self._tx():
            ids = self._ids_where(list(sample_ids), ("dead",)) if sample_ids else []
            return self._restore(ids, time.time()) if ids else 0

    def drop(self, sample_ids: Sequence[str]) -> int:
        """Delete dead samples for good. Returns how many."""
        with self._tx():
            ids = self._ids_where(list(sample_ids), ("dead",)) if sample_ids else []
            if ids:
                self._db.execute(f"DELETE FROM samples WHERE sample_id IN ({_marks(len(ids))})", tuple(ids))
                self._db.execute(f"DELETE FROM dead_letters WHERE sample_id IN ({_marks(len(ids))})", tuple(ids))
            return len(ids)

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
                f"SELECT sample_id, state FROM samples WHERE sample_id IN ({_marks(len(sample_ids))})",
                tuple(sample_ids),
            ).fetchall()
        return dict(rows)

    def stats(self) -> dict[str, Any]:
        """Counts by state and by (state, generation), the oldest fresh sample's age, the generation,
        open leases, pending evolution fences and dead letters.

        NOTE: the GROUP BY walks the (state, generation) index, O(buffer) but index-only; it feeds
        status/metrics (throttled), never the training hot path.
        """
        now = time.time()
        with self._lock:
            rows = self._db.execute(
                "SELECT state, generation, COUNT(*) FROM samples GROUP BY state, generation"
            ).fetchall()
            oldest = self._db.execute(
                "SELECT created_at FROM samples WHERE state = 'fresh' AND generation = ? ORDER BY seq LIMIT 1",
                (self._generation,),
            ).fetchone()
            open_leases = self._db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]
            fences = self._db.execute("SELECT COUNT(*) FROM fences WHERE expires_at > ?", (now,)).fetchone()[0]
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
            "oldest_fresh_age_s": (now - oldest[0]) if oldest else None,
            "open_leases": open_leases,
            "pending_fences": fences,
            "dead_letters": by_state["dead"],
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
