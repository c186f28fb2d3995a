"""`Memory`: the Ray actor that ingests completed main turns, off the request path.

Whoever scores turns calls `observe(turn, sample)` fire-and-forget (the PRM, wired by name by the
composition root, as it tells the `Evolver`). The turn is queued durably in the store's inbox at once;
a conversation's pending turns are ingested (memory/ingest.py) when it reaches `every_n_turns` of
them, when its last turn arrives (session end or idle flush), and by a sweep for conversations whose
oldest pending turn is older than `flush_after_s`. One ingestion runs at a time (embedding is CPU
work; the request path never waits for it). The sweep also applies retention. It is an async actor:
`observe` is served while an ingestion waits on an LLM.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from core import names
from core.agent_context import AGENT_CONTEXT_MARKERS
from core.config import MemoryConfig, StateConfig
from core.contracts import Sample, Turn
from core.db import DatabaseError
from memory.extract import OfflineExtractor
from memory.ingest import Extractor, Ingestor, IngestReport, Owner, entry_of
from memory.open import open_memory_store
from memory.retrieval import Embedder

log = logging.getLogger("clawray.memory")
SWEEP_S = 30.0


def make_extractor(cfg: MemoryConfig) -> Extractor:
    """The extractor `cfg.extractor` names (`llm` goes through the one LLM client, core/llm.py)."""
    if cfg.extractor == "llm" and cfg.llm is not None:
        from core.llm import LLMClient
        from memory.llm_extract import LLMExtractor

        return LLMExtractor(LLMClient(cfg.llm), cfg.llm_retries)
    return OfflineExtractor()


class MemoryActor:
    """Args: the storage root's memory folder (`<storage root>/memory`), the memory section, a factory of the
    embedder (called inside the actor: models do not pickle; None = no vectors), and the `state` section
    (its dict; with `dsn` the store is PostgreSQL, memory/open.py)."""

    def __init__(self, memory_dir: str, cfg: MemoryConfig, embedder_factory: Callable[[], Embedder] | None = None,
                 *, metrics: bool = True, state: StateConfig | dict | None = None,
                 agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS):
        logging.basicConfig(level=logging.INFO)
        self.cfg = cfg
        self.agent_markers = tuple(agent_markers)  # what in a user message is the agent's (core/agent_context.py)
        self.store = open_memory_store(memory_dir, state, storage_root=Path(memory_dir).parent)
        self.ingestor = Ingestor(self.store, cfg, make_extractor(cfg),
                                 embedder_factory() if embedder_factory is not None else None)
        self.metrics = None
        if metrics:
            from memory.metrics import IngestMetrics

            self.metrics = IngestMetrics()
        self.counts: dict[str, int] = {}
        self.last_reports: list[dict[str, Any]] = []
        self._fallbacks_seen = 0
        self._lock: asyncio.Lock | None = None
        self._scheduled: set[Owner] = set()
        self._tasks: set[asyncio.Task] = set()  # ingestions scheduled or running
        self._sweeper: asyncio.Task | None = None

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _start(self) -> None:
        """Start the sweep, once (it needs the actor's running loop, so not in __init__)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def ready(self) -> dict[str, Any]:
        """Start the sweep and return the stats (the composition root waits on this)."""
        self._start()
        return await self.stats()

    async def observe(self, turn: Turn, sample: Sample | None = None) -> bool:
        """Queue one completed turn (True: queued now); schedules its conversation's ingestion when due."""
        self._start()
        entry = entry_of(turn, self.cfg.include_default_user, self.agent_markers)
        if entry is None:
            self._turn("ignored")
            return False
        if not await asyncio.to_thread(self.store.inbox_add, entry):
            self._turn("duplicate_or_forgotten")
            return False
        self._turn("queued")
        owner = (entry.user, entry.workspace, entry.session_id)
        pending = await asyncio.to_thread(self.store.inbox_pending, *owner)
        if entry.last or len(pending) >= self.cfg.every_n_turns:
            self._schedule(owner)
        return True

    def _turn(self, outcome: str) -> None:
        self._count(f"turns_{outcome}")
        if self.metrics is not None:
            self.metrics.turns.inc(1, {"outcome": outcome})

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _schedule(self, owner: Owner) -> None:
        if owner not in self._scheduled:
            self._scheduled.add(owner)
            self._spawn(self._run(owner))

    async def _run(self, owner: Owner) -> IngestReport:
        from core.llm import LLMError

        assert self._lock is not None
        async with self._lock:
            self._scheduled.discard(owner)  # turns arriving from now on schedule another run
            try:
                report = await self.ingestor.ingest(owner)
            except (LLMError, sqlite3.Error, DatabaseError, OSError) as e:  # turns stay pending; the sweep retries
                log.warning("memory ingestion of a conversation failed (%s: %s); retried later",
                            type(e).__name__, e)
                self._count("ingest_errors")
                return IngestReport(owner, error=f"{type(e).__name__}: {e}")
        self._done(report)
        return report

    def _done(self, r: IngestReport) -> None:
        if not r.turns:
            return
        self._count("batches")
        self._count("turns_ingested" if r.written else "batches_discarded", r.turns if r.written else 1)
        for action in ("inserted", "merged", "superseded"):
            self._count(f"units_{action}", getattr(r, action))
        self.last_reports = [*self.last_reports[-19:], {**asdict(r), "owner": None}]  # no ids in stats
        new_fallbacks, self._fallbacks_seen = self.ingestor.fallbacks - self._fallbacks_seen, self.ingestor.fallbacks
        self._count("extraction_fallbacks", new_fallbacks)
        if self.metrics is not None:
            if new_fallbacks:
                self.metrics.fallbacks.inc(new_fallbacks)
            if r.written:
                self.metrics.turns.inc(r.turns, {"outcome": "ingested"})
                for action in ("inserted", "merged", "superseded"):
                    if getattr(r, action):
                        self.metrics.written.inc(getattr(r, action), {"action": action})
                self.metrics.lag.observe(r.lag_s)

    async def ingest_now(self, user: str | None = None) -> list[dict[str, Any]]:
        """Ingest every pending conversation (of `user` if given) now; their reports (operators, tests)."""
        self._start()
        owners = await asyncio.to_thread(self.store.inbox_owners)
        reports = [await self._run((u, w, s)) for u, w, s, *_ in owners if user is None or u == user]
        return [{**asdict(r), "owner": list(r.owner)} for r in reports]

    async def sweep(self, now: float | None = None) -> int:
        """Schedule conversations that ended or waited `flush_after_s`; apply retention. Returns the
        number of units retention deleted."""
        now = time.time() if now is None else now
        for user, ws, session, oldest, last, _ in await asyncio.to_thread(self.store.inbox_owners):
            if last or now - oldest >= self.cfg.flush_after_s:
                self._schedule((user, ws, session))
        max_age = self.cfg.max_age_days * 86400 if self.cfg.max_age_days else None
        gone = await asyncio.to_thread(self.store.prune, self.cfg.max_units_per_scope, max_age, now)
        if self.metrics is not None:
            self.metrics.gauges(await asyncio.to_thread(self.store.stats))
        return gone

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self._count("retention_deleted", await self.sweep())
            except (sqlite3.Error, DatabaseError, OSError) as e:
                log.warning("memory sweep failed: %s", e)

    async def forget(self, user: str, workspace: str | None = None, session: str | None = None) -> int:
        return await asyncio.to_thread(self.store.forget, user, workspace, session)

    async def stats(self) -> dict[str, Any]:
        store = await asyncio.to_thread(self.store.stats)
        lag = time.time() - store["inbox_oldest"] if store["inbox_oldest"] else 0.0
        return {**store, "pending_lag_s": lag, "counts": dict(self.counts), "extractor": self.cfg.extractor,
                "embedder": self.ingestor.embedder is not None, "recent": self.last_reports[-5:]}


Memory = ray.remote(num_cpus=0.1, max_restarts=-1)(MemoryActor)


def get_or_create_memory(memory_dir: str, cfg: MemoryConfig, embedder_factory: Callable[[], Embedder] | None,
                         *, name: str, namespace: str, detached: bool = False, state: dict | None = None,
                         agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS):
    """The named `Memory` actor handle, created if it does not exist (the composition root calls this)."""
    opts: dict[str, Any] = {"name": name, "namespace": namespace, "get_if_exists": True}
    if detached:
        opts["lifetime"] = "detached"
    names.forget(name, namespace)  # a handle this process cached may be of a killed incarnation
    return Memory.options(**opts).remote(memory_dir, cfg, embedder_factory, state=state, agent_markers=agent_markers)
