"""Hybrid retrieval, the read side the Proxy uses in-process (DESIGN.md's deliberate read-side import).

`MemorySearch.search(query, scopes)`: full text (the store's FTS) and embeddings (the in-process
`VectorIndex`) each propose `candidates` unit ids; the vector leg (encode the query through the
embedder's query path, then search) runs on a helper thread while the full text search runs (the
encoder, numpy and SQLite release the GIL), or with `overlap=False` before it on the calling thread: the
overlap saves ~1 ms when a core is idle and costs about as much when both are busy (the hand-off to a
second thread; measured side by side in benchmarks/memory_retrieval.py). Query vectors are cached (LRU,
`QUERY_CACHE` texts): an agent's tool-call steps resend the same last user message, and the encode is
most of the cost on CPU. The proposals' stored rows are fetched (the full-text leg's while the vector leg
still runs, then the vector leg's others), which drops any unit outside the request's exact scopes,
superseded or deleted (the isolation check), then fused (memory/fusion.py) on those rows; units are built only for the `top_k` kept.
Scopes that hold no unit cost one SQL query and no encoding.
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
from memory.rows import unit_of, unit_row
from memory.store import MemoryStore
from memory.units import MemoryUnit, Scope

QUERY_CACHE = 256


class Embedder(Protocol):
    """Texts -> L2-normalised vectors; the composition root hands one in (all-MiniLM-L6-v2 by default,
    the model the skills plane uses: `evolve.embedding.SentenceEmbedder` has this shape)."""

    dim: int
    encoder_id: str  # the vector space (stored vectors record theirs: memory/index.py)

    def encode(self, texts: list[str]) -> np.ndarray:
        """(N,) texts -> (N, dim) float32 unit rows."""
        ...

    # Optional: `encode_query(text) -> (dim,)`, a cheaper path for one query in the same space
    # (SentenceEmbedder's int8 graph); used when present, else `encode([text])[0]`.


@dataclass(frozen=True)
class SearchResult:
    hits: list[tuple[MemoryUnit, float]]  # (unit, fused score), best first
    full_text: int  # ids the full-text leg proposed
    vector: int  # ids the vector leg proposed (above min_similarity)
    seconds: float


def weights_of(cfg: MemoryConfig) -> FusionWeights:
    return FusionWeights(cfg.rrf_k, cfg.recency_half_life_days, cfg.recency_weight, dict(cfg.kind_weights))


class MemorySearch:
    """Args: the store, the memory section, an embedder (None = full text only), and `overlap`: run the
    vector leg on a helper thread beside the full-text leg (False: one after the other; see above)."""

    def __init__(self, store: MemoryStore, cfg: MemoryConfig, embedder: Embedder | None = None,
                 overlap: bool = True):
        self.store, self.cfg, self.embedder = store, cfg, embedder
        self.index = (VectorIndex(store, embedder.dim, exact_limit=cfg.exact_search_limit,
                                  encoder_id=embedder.encoder_id) if embedder is not None else None)
        self.weights = weights_of(cfg)
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="memory-encode")
                      if embedder is not None and overlap else None)
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
        legs = (query, present, {k: versions[k] for k in present})
        vector_leg = self._pool.submit(self._vector_ids, *legs) if self._pool is not None else None
        vec_ids = self._vector_ids(*legs) if vector_leg is None and self.index is not None else []
        text_ids = self.store.full_text(present, query, self.cfg.candidates, self.cfg.fts_max_df)
        if vector_leg is None:  # both legs done: one fetch
            rows = self.store.fetch_rows(list(dict.fromkeys([*text_ids, *vec_ids])), scopes)
        else:  # the full-text leg's rows while the vector leg (the longer one) still runs, then the rest
            rows = self.store.fetch_rows(text_ids, scopes)
            vec_ids, seen = vector_leg.result(), set(text_ids)
            rows += self.store.fetch_rows([u for u in dict.fromkeys(vec_ids) if u not in seen], scopes)
        # fuse reads unit_id, kind, updated_at and confidence: the rows carry them, units are built for top_k
        fused = fuse([text_ids, vec_ids], {r[0]: unit_row(r) for r in rows}, now, self.weights)
        hits = [(unit_of(r.row), score) for r, score in fused[: self.cfg.top_k]]
        return SearchResult(hits, len(text_ids), len(vec_ids), time.perf_counter() - t0)

    def _vector_ids(self, query: str, keys: list[str], versions: dict[str, int]) -> list[str]:
        """The vector leg: ids of the best `candidates` units at or above `min_similarity`."""
        qvec = self._cached(query)
        if qvec is None:
            qvec = self._encode(query)
        hits = self.index.search(keys, qvec, self.cfg.candidates, versions=versions)  # type: ignore[union-attr]
        return [uid for uid, cos in hits if cos >= self.cfg.min_similarity]

    def _cached(self, query: str) -> np.ndarray | None:
        with self._cache_lock:
            vec = self._vectors.get(query)
            if vec is not None:
                self._vectors.move_to_end(query)
            return vec

    def _encode(self, query: str) -> np.ndarray:
        encode_query = getattr(self.embedder, "encode_query", None)
        vec = encode_query(query) if encode_query is not None else self.embedder.encode([query])[0]  # type: ignore[union-attr]
        with self._cache_lock:
            self._vectors[query] = vec
            while len(self._vectors) > QUERY_CACHE:
                self._vectors.popitem(last=False)
        return vec
