"""Ingestion: completed main turns -> inbox -> extraction -> scoping -> consolidation -> the store.

No Ray here; the `Memory` actor (memory/actor.py) drives it off the request path. A conversation is
owned by (user, workspace, session): the inbox is read, and units are scoped, per owner, so two users
who send the same session id never share a batch. Extraction failures: an LLM endpoint that is down
(`LLMError`, retryable) leaves the turns pending for a later try; a reply that stays invalid after the
re-asks, or a refused request, falls back to the offline extractor for that batch.
A batch is written only if all its turns are still pending when it commits (`store.apply`): a forget
that lands during extraction wins, and nothing of the forgotten owner is written back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from core.agent_context import AGENT_CONTEXT_MARKERS, own_texts
from core.config import MemoryConfig
from core.contracts import Turn, TurnType
from memory.consolidate import consolidate, same_text
from memory.extract import OfflineExtractor, working_summary
from memory.index import VectorIndex, adopt_encoder
from memory.llm_extract import ExtractionError
from memory.retrieval import Embedder
from memory.store import InboxEntry, MemoryStore
from memory.units import Candidate, Kind, Level, MemoryUnit, Scope, capped, scope_at, split_tenant

log = logging.getLogger("clawray.memory")
DEFAULT_USER = "default"  # the user of requests that send no X-User-Id (serve/turns.py)

Owner = tuple[str, str, str]  # (user, workspace, session)


class Extractor(Protocol):
    name: str

    async def extract(self, entries: Sequence[InboxEntry]) -> list[Candidate]: ...


def entry_of(turn: Turn, include_default_user: bool,
             markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> InboxEntry | None:
    """The inbox entry for a completed turn, or None when it is not remembered (a side turn, a request
    with `X-Memory-Scope: off`, or the anonymous default user unless configured). The user's texts are
    their own words (core/agent_context.py): the reminders, environment and internal context an agent puts
    in a user message (`markers`) are not what the user said, and tool results are no text."""
    if turn.turn_type != TurnType.main or turn.memory_scope == "off":
        return None
    user, workspace = split_tenant(turn.tenant)
    if user == DEFAULT_USER and not include_default_user:
        return None
    # The turn's new input: the user messages after the last assistant message (earlier ones belong to
    # earlier turns, which were ingested with those; the system prompt holds injected skills and memory).
    new: list[str] = []
    for m in turn.messages:
        if m.get("role") == "assistant":
            new = []
        elif m.get("role") == "user":
            new.append("\n".join(own_texts(m.get("content"), markers)))
    return InboxEntry(turn.turn_id, turn.session_id, user, workspace, turn.memory_scope, turn.turn_index,
                      turn.created_at, turn.last_in_session, [t for t in new if t.strip()], turn.response_text)


@dataclass
class IngestReport:
    owner: Owner
    turns: int = 0
    candidates: int = 0
    inserted: int = 0
    merged: int = 0
    superseded: int = 0
    extractor: str = ""
    written: bool = False
    lag_s: float = 0.0  # now - the oldest turn's creation, when written
    error: str | None = None
    kinds: dict[str, int] = field(default_factory=dict)  # inserted units by kind


_DEPTH = {"user": 0, "workspace": 1, "session": 2}


def _narrowest(caps: Sequence[str]) -> str:
    return max(caps, key=lambda c: _DEPTH[c])


def scoped_units(cands: Sequence[Candidate], entries: Sequence[InboxEntry], owner: Owner,
                 now: float) -> list[MemoryUnit]:
    """Fresh units for `cands`: each in its proposed scope, narrowed to the cap of the turns it came from
    (units of the whole batch: the narrowest cap of the batch)."""
    user, workspace, session = owner
    caps = {e.turn_id: e.cap for e in entries}
    batch_cap = _narrowest([e.cap for e in entries])
    out = []
    for c in cands:
        cap = _narrowest([caps[t] for t in c.source_turns if t in caps] or [batch_cap])
        scope = scope_at(capped(c.level, cap), user, workspace, session)
        turns = c.source_turns or [e.turn_id for e in entries]
        out.append(MemoryUnit(kind=c.kind, content=c.content, key=c.key, level=scope.level, user=scope.user,
                              workspace=scope.workspace, session=scope.session, source_session=session,
                              source_turns=turns, created_at=now, updated_at=now, confidence=c.confidence))
    return out


class Ingestor:
    """Args: the store, the memory section, the configured extractor, and the embedder (None: no vectors;
    duplicates are then only identical texts). The write side keeps its own `VectorIndex` for the
    consolidation's nearest-neighbour lookups. With an embedder, the store's vectors are made its own
    first (re-encoded when another encoder made them: memory/index.py `adopt_encoder`)."""

    def __init__(self, store: MemoryStore, cfg: MemoryConfig, extractor: Extractor,
                 embedder: Embedder | None = None):
        self.store, self.cfg, self.extractor, self.embedder = store, cfg, extractor, embedder
        self.offline = OfflineExtractor()
        self.index = None
        if embedder is not None:
            adopt_encoder(store, embedder.encoder_id, embedder.encode)
            self.index = VectorIndex(store, embedder.dim, encoder_id=embedder.encoder_id)
        self.fallbacks = 0

    async def extract(self, entries: Sequence[InboxEntry]) -> tuple[list[Candidate], str]:
        """Candidates and the name of the extractor that produced them; raises a retryable LLMError."""
        from core.llm import LLMError  # the LLM stack is imported only when an LLM is configured

        try:
            return await self.extractor.extract(entries), self.extractor.name
        except LLMError as e:
            if e.retryable:
                raise
            log.warning("memory extraction refused (%s); offline rules for this batch", e)
        except ExtractionError as e:  # the reply stayed invalid after the re-asks
            log.warning("memory extraction reply invalid (%s); offline rules for this batch", e)
        self.fallbacks += 1
        return await self.offline.extract(entries), self.offline.name

    def summary(self, entries: Sequence[InboxEntry], owner: Owner, cands: list[Candidate]) -> Candidate | None:
        """The rolling working summary, for conversations of `summary_min_turns` turns and more (unless
        the extractor wrote one)."""
        turns = max(e.turn_index for e in entries) + 1
        if turns < self.cfg.summary_min_turns or any(c.kind == Kind.working_summary for c in cands):
            return None
        prev = self.store.slot(scope_at(Level.session, *owner), Kind.working_summary, "summary")
        return working_summary(entries, prev.content if prev else None, turns)

    def write(self, entries: Sequence[InboxEntry], owner: Owner, cands: list[Candidate],
              report: IngestReport, now: float) -> IngestReport:
        """Scope, embed, consolidate and apply one batch (blocking: run it in a thread)."""
        summary = self.summary(entries, owner, cands)
        units = scoped_units([*cands, *([summary] if summary else [])], entries, owner, now)
        vecs: list[np.ndarray | None] = (list(self.embedder.encode([u.content for u in units]))
                                         if self.embedder is not None and units else [None] * len(units))
        plan = consolidate(list(zip(units, vecs, strict=True)), self.store.slot, self._nearest,
                           self.cfg.dedup_threshold)
        report.written = self.store.apply(plan, [e.turn_id for e in entries])
        if report.written:
            report.inserted, report.merged = len(plan.inserts), len(plan.merges)
            report.superseded = len(plan.supersessions) + sum(1 for u, _ in plan.inserts if u.superseded_by)
            report.lag_s = now - min(e.created_at for e in entries)
            for u, _ in plan.inserts:
                report.kinds[u.kind.value] = report.kinds.get(u.kind.value, 0) + 1
        return report

    def _nearest(self, scope: Scope, kind: Kind, vec: np.ndarray | None, content: str) -> tuple[MemoryUnit | None, float]:
        if vec is None or self.index is None:  # no vectors: only the same text is a duplicate
            ids = self.store.full_text([scope.key], content, 5, self.cfg.fts_max_df)
            same = [u for u in self.store.fetch(ids, [scope]) if u.kind == kind and same_text(u.content, content)]
            return (same[0], 1.0) if same else (None, -1.0)
        hits = self.index.search([scope.key], vec, 1, kind)
        if not hits:
            return None, -1.0
        unit = self.store.get(hits[0][0])
        return (unit, hits[0][1]) if unit is not None and unit.active else (None, -1.0)

    async def ingest(self, owner: Owner, now: float | None = None) -> IngestReport:
        """Extract and write the pending turns of one conversation owner."""
        report = IngestReport(owner)
        entries = await asyncio.to_thread(self.store.inbox_pending, *owner)
        if not entries:
            return report
        report.turns = len(entries)
        cands, report.extractor = await self.extract(entries)
        report.candidates = len(cands)
        return await asyncio.to_thread(self.write, entries, owner, cands, report, time.time() if now is None else now)
