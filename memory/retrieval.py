"""Hybrid retrieval, the read side the Proxy uses in-process (DESIGN.md's deliberate read-side import).

`MemorySearch.search(query, scopes)`: full text (the store's FTS) and embeddings (the in-process
`VectorIndex`) each propose `candidates` unit ids; the query is encoded on a helper thread while the full
text search runs (both release the GIL). Query vectors are cached (LRU, `QUERY_CACHE` texts): an agent's
tool-call steps resend the same last user message, and encoding is most of the cost on CPU. The proposals are fetched from the store, which drops any
unit outside the request's exact scopes, superseded or deleted (the isolation check), then fused
(memory/fusion.py). Scopes that hold no unit cost one SQL query and no encoding.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from core.config import MemoryConfig
from memory.fusion import FusionWeights, fuse
from memory.index import VectorIndex
from memory.store import MemoryStore
from memory.units import MemoryUnit, Scope

QUERY_CACHE = 256


class Embedder(Protocol):
    """Texts -> L2-normalised vectors; the composition root hands one in (all-MiniLM-L6-v2 by default,
    the model the skills plane uses: `evolve.embedding.SentenceEmbedder` has this shape)."""

    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """(N,) texts -> (N, dim) float32 unit rows."""
        ...


@dataclass(frozen=True)
class SearchResult:
    hits: list[tuple[MemoryUnit, float]]  # (unit, fused score), best first
    full_text: int  # ids the full-text leg proposed
    vector: int  # ids the vector leg proposed (above min_similarity)
    seconds: float


def weights_of(cfg: MemoryConfig) -> FusionWeights:
    return FusionWeights(cfg.rrf_k, cfg.recency_half_life_days, cfg.recency_weight, dict(cfg.kind_weights))


class MemorySearch:
    """Args: the store, the memory section, and an embedder (None = full text only)."""

    def __init__(self, store: MemoryStore, cfg: MemoryConfig, embedder: Embedder | None = None):
        self.store, self.cfg, self.embedder = store, cfg, embedder
        self.index = (VectorIndex(store, embedder.dim, exact_limit=cfg.exact_search_limit)
                      if embedder is not None else None)
        self.weights = weights_of(cfg)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="memory-encode") if embedder is not None else None
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()  # query text -> vector (LRU)
        self._cache_lock = threading.Lock()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def search(self, query: str, scopes: list[Scope], now: float | None = None) -> SearchResult:
        """The request's best units (at most `top_k`), blocking. Empty when no scope holds anything."""
        t0 = time.perf_counter()
        now = time.time() if now is None else now
        query = query[: self.cfg.query_max_chars]
        keys = [s.key for s in scopes]
        versions = self.store.scope_versions(keys)  # one query, not one per scope
        present = [k for k in keys if k in versions]
        if not present or not query.strip() or self.cfg.top_k == 0:
            return SearchResult([], 0, 0, time.perf_counter() - t0)
        cached = self._cached(query)
        encoding = self._pool.submit(self._encode, query) if cached is None and self._pool is not None else None
        text_ids = self.store.full_text(present, query, self.cfg.candidates, self.cfg.fts_max_df)
        vec_ids: list[str] = []
        qvec = encoding.result() if encoding is not None else cached
        if qvec is not None and self.index is not None:
            hits = self.index.search(present, qvec, self.cfg.candidates)
            vec_ids = [uid for uid, cos in hits if cos >= self.cfg.min_similarity]
        units = self.store.fetch(list(dict.fromkeys([*text_ids, *vec_ids])), scopes)
        fused = fuse([text_ids, vec_ids], {u.unit_id: u for u in units}, now, self.weights)
        return SearchResult(fused[: self.cfg.top_k], len(text_ids), len(vec_ids), time.perf_counter() - t0)

    def _cached(self, query: str) -> np.ndarray | None:
        with self._cache_lock:
            vec = self._vectors.get(query)
            if vec is not None:
                self._vectors.move_to_end(query)
            return vec

    def _encode(self, query: str) -> np.ndarray:
        vec = self.embedder.encode([query])[0]  # type: ignore[union-attr]
        with self._cache_lock:
            self._vectors[query] = vec
            while len(self._vectors) > QUERY_CACHE:
                self._vectors.popitem(last=False)
        return vec
