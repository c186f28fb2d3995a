"""One write transaction of the replay buffer (train/replay_store.py): the rules every write applies.

A `ReplayTx` is made inside `db.tx(STORE_LOCK)` and reads the current generation from `meta` first, so
every decision in the transaction (arrival state, what a lease may take, whether a seal holds) uses the
generation as committed by whichever process wrote it last: a `clawray dlq` command or a second Replay
after a failover may have moved it since this process last looked, and a cached value would be stale.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from core.contracts import Sample, SampleState
from core.db import Conn

CLAIMABLE = ("fresh", "leased", "retired", "masked")  # what an evolution may turn into support


def marks(n: int) -> str:
    return ",".join("?" * n)


def read_generation(c: Conn) -> int:
    row = c.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    return int(row[0]) if row else 0


def scan_limit(batch_size: int) -> int:
    """Rows a lease looks at: enough to skip incomplete groups at the head of the queue, still O(batch)."""
    return 4 * batch_size + 256


class ReplayTx:
    """The buffer as seen by one write transaction `c` at time `now` (all writes hold the store lock)."""

    def __init__(self, c: Conn, now: float, lease_sql: str) -> None:
        self.c, self.now, self._lease_sql = c, now, lease_sql
        self.generation = read_generation(c)

    # ------------------------------------------------------------------ generation
    def advance(self, generation: int) -> int:
        """Move the current generation forward (never back); returns samples retired."""
        if generation <= self.generation:
            return 0
        self.c.execute(
            "INSERT INTO meta(key, value) VALUES('generation', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (str(generation),),
        )
        self.generation = generation
        return self.c.execute(
            "UPDATE samples SET state = 'retired', updated_at = ? WHERE state = 'fresh' AND generation < ?",
            (self.now, generation),
        ).rowcount

    def arrival_state(self, s: Sample) -> SampleState:
        """Where a sample belongs when it arrives (or comes back from support / the dead letters)."""
        if not s.trainable and (s.group_id is None or s.group_size <= 1):  # a group member stays leasable
            return "masked"
        return "retired" if s.skill_generation < self.generation else "fresh"

    def fence_pending(self) -> bool:
        return self.c.execute("SELECT 1 FROM fences WHERE expires_at > ? LIMIT 1", (self.now,)).fetchone() is not None

    # ------------------------------------------------------------------ states
    def ids_where(self, ids: Sequence[str], states: Sequence[str]) -> list[str]:
        """Sample ids (matched by sample_id or turn_id) whose state is one of `states`, in `ids` order."""
        if not ids:
            return []
        rows = self.c.execute(
            f"SELECT sample_id, turn_id FROM samples WHERE state IN ({marks(len(states))}) "
            f"AND (sample_id IN ({marks(len(ids))}) OR turn_id IN ({marks(len(ids))}))",
            (*states, *ids, *ids),
        ).fetchall()
        order = {x: i for i, x in enumerate(ids)}
        rows.sort(key=lambda r: order.get(r[0], order.get(r[1], 0)))
        return [r[0] for r in rows]

    def set_state(self, sample_ids: Sequence[str], state: str) -> int:
        if not sample_ids:  # `IN ()` is an error on PostgreSQL
            return 0
        return self.c.execute(
            f"UPDATE samples SET state = ?, lease_id = NULL, lease_expires = NULL, updated_at = ? "
            f"WHERE sample_id IN ({marks(len(sample_ids))})",
            (state, self.now, *sample_ids),
        ).rowcount

    def restore(self, sample_ids: Sequence[str]) -> int:
        """Support or dead rows go back to where they would be now (fresh, retired or masked)."""
        if not sample_ids:
            return 0
        for sid, payload in self.c.execute(
            f"SELECT sample_id, payload FROM samples WHERE sample_id IN ({marks(len(sample_ids))})",
            tuple(sample_ids),
        ).fetchall():
            self.set_state([sid], self.arrival_state(Sample.model_validate_json(payload)))
        return len(sample_ids)

    def return_where(self, where: str, args: tuple[Any, ...]) -> int:
        """Rows matching `where` go back to fresh or retired; a lease left holding nothing is dropped."""
        rows = self.c.execute(f"SELECT seq, generation, lease_id FROM samples WHERE {where}", args).fetchall()
        for seq, generation, _ in rows:
            self.c.execute(
                "UPDATE samples SET state = ?, lease_id = NULL, lease_expires = NULL, updated_at = ? "
                "WHERE seq = ?",
                ("fresh" if generation >= self.generation else "retired", self.now, seq),
            )
        for lease_id in {r[2] for r in rows}:
            held = self.c.execute("SELECT 1 FROM samples WHERE lease_id = ? AND state IN ('leased', 'sealed') "
                                  "LIMIT 1", (lease_id,)).fetchone()
            if held is None:  # a lease with sealed rows left stays, so its owner's recovery finds them
                self.c.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
        return len(rows)

    def release_expired(self) -> int:
        return self.return_where("state = 'leased' AND lease_expires < ?", (self.now,))

    def bury(self, sample_ids: Sequence[str], error: str) -> int:
        """To the dead letters (not trained or sealed ones; a dead one counts another attempt)."""
        ids = self.ids_where(sample_ids, (*CLAIMABLE, "support", "dead"))
        if not ids:
            return 0
        self.set_state(ids, "dead")
        self.c.executemany(
            "INSERT INTO dead_letters(sample_id, error, at, attempts) VALUES(?, ?, ?, 1) ON CONFLICT(sample_id) "
            "DO UPDATE SET error = excluded.error, at = excluded.at, attempts = dead_letters.attempts + 1",
            [(i, error[:2000], self.now) for i in ids],
        )
        return len(ids)

    # ------------------------------------------------------------------ fences
    def fence_claims(self, token: str) -> set[str] | None:
        row = self.c.execute("SELECT claimed FROM fences WHERE token = ?", (token,)).fetchone()
        return set(json.loads(row[0])) if row else None

    # ------------------------------------------------------------------ leasing
    def pick(self, batch_size: int) -> list[tuple[int, Sample]]:
        """First-fit units (a loose sample, or a whole group) of the current generation in arrival order."""
        rows = self.c.execute(self._lease_sql, (self.generation, scan_limit(batch_size))).fetchall()
        picked: list[tuple[int, Sample]] = []
        seen: set[str] = set()
        for seq, sid, gid, gsize, payload in rows:
            if gid is not None and gsize > 1:
                if gid in seen:
                    continue
                seen.add(gid)
                unit = self._whole_group(gid, gsize)
            else:
                unit = self._parsed([(seq, sid, payload)])
            if not unit or (picked and len(picked) + len(unit) > batch_size):
                continue  # waits for a later lease (it is then the oldest, so it is never starved)
            picked += unit
            if len(picked) >= batch_size:  # also: a group larger than the batch, leased alone
                break
        return picked

    def _whole_group(self, gid: str, size: int) -> list[tuple[int, Sample]]:
        """The group's members if it is leasable now (all arrived, all fresh and current), else []."""
        rows = self.c.execute(
            "SELECT seq, sample_id, payload, state, generation FROM samples WHERE group_id = ? ORDER BY seq",
            (gid,),
        ).fetchall()
        if len(rows) < size or any(st != "fresh" or g != self.generation for *_, st, g in rows):
            return []
        unit = self._parsed([r[:3] for r in rows])
        if len(unit) < len(rows):
            return []
        if not any(s.trainable for _, s in unit):  # nothing to train in the whole group
            self.set_state([s.sample_id for _, s in unit], "masked")
            return []
        return unit

    def _parsed(self, rows: Sequence[tuple[int, str, str]]) -> list[tuple[int, Sample]]:
        out = []
        for seq, sid, payload in rows:
            try:
                out.append((seq, Sample.model_validate_json(payload)))
            except ValidationError as e:  # a poison row must not fail every lease forever
                self.bury([sid], f"stored sample does not parse: {e}")
        return out
