"""Where scored samples go: the replay buffer's append interface (`SampleSink`).

- `ReplayActorSink`: the slow loop's named `Replay` actor (train plane).
- `LocalSampleSink`: a durable local SQLite file with the same interface, for the embedded default
  and for tests, until/unless the Replay actor is used.

Contract: `await sink.append(samples)` returns only after the samples are durable, and returns how
many were newly stored (a sample whose `sample_id` is already stored is ignored, so a retried turn
is stored once).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

from core import names
from core.contracts import Sample
from rewards.errors import SinkUnavailable

SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    sample_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    turn_index INTEGER NOT NULL,
    reward REAL NOT NULL,
    trainable INTEGER NOT NULL,
    skill_generation INTEGER NOT NULL,
    created_at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_session ON samples (session_id, turn_index);
"""


@runtime_checkable
class SampleSink(Protocol):
    async def append(self, samples: list[Sample]) -> int:
        """Store `samples` durably; the number newly stored."""
        ...


class LocalSampleSink:
    """Samples in one SQLite file (WAL, synchronous=FULL: a committed append survives a crash).

    One connection guarded by a lock; `append` runs it in a worker thread so an async caller's
    event loop is not blocked by fsync.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def append_sync(self, samples: list[Sample]) -> int:
        rows = [
            (s.sample_id, s.session_id, s.turn_index, s.reward, int(s.trainable), s.skill_generation,
             s.created_at, s.model_dump_json())
            for s in samples
        ]
        with self._lock:
            before = self._db.total_changes
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return self._db.total_changes - before

    async def append(self, samples: list[Sample]) -> int:
        try:
            return await asyncio.to_thread(self.append_sync, samples)
        except sqlite3.Error as e:
            raise SinkUnavailable(f"local sample store {self.path}: {e}") from e

    def samples(self, session_id: str | None = None) -> list[Sample]:
        """Stored samples (of one session), in session/turn order."""
        query, args = "SELECT body FROM samples ORDER BY session_id, turn_index", ()
        if session_id is not None:
            query, args = "SELECT body FROM samples WHERE session_id = ? ORDER BY turn_index", (session_id,)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [Sample.model_validate_json(r[0]) for r in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class ReplayActorSink:
    """Appends through the named `Replay` actor: `await Replay.append.remote(samples) -> int`.

    The handle is looked up by name (core/names.py, one try) on first use and again after a failure
    (the actor may have been restarted or started late). Any failure is a retryable SinkUnavailable.
    """

    def __init__(self, name: str = names.REPLAY, namespace: str = names.DEFAULT_NAMESPACE):
        self.name = name
        self.namespace = namespace

    async def append(self, samples: list[Sample]) -> int:
        from ray.exceptions import RayError  # only this sink needs Ray; LocalSampleSink works without it

        try:
            handle = await names.actor_async(self.name, self.namespace, timeout_s=0)
            return int(await handle.append.remote(samples))
        except (ValueError, RayError) as e:  # ValueError: no actor of that name (yet)
            names.forget(self.name, self.namespace)
            raise SinkUnavailable(f"replay actor {self.name!r} did not store the samples: {e}") from e
