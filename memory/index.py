"""The in-process vector index of memory units, per scope, kept in sync with the store by version.

Search is exact (one (N, D) product) up to `exact_limit` rows; above it, a binary prefilter: every unit
vector is also kept as D sign bits, the Hamming distance to the query's bits (a popcount over N x D/64
words) picks `max(min_rescore, rescore * k)` candidates, and those are ranked by their exact cosine.
Why: at 100k units the exact product reads 150 MB per query (~8 ms on an idle 2-core machine, 15 ms on a
busy one), the bits read 4.8 MB (~0.6 ms), and the cut at the `m` nearest is a histogram of the distances
(~0.15 ms).
Recall against exact search is measured in benchmarks/memory_retrieval.py.
A scope whose stored vectors were made by another encoder than the index's (`encoder_id`; memory/store.py)
proposes nothing: its queries would be compared with vectors of another space. The writer's start
(`adopt_encoder`) re-encodes the store when the configured encoder changes.
The pure math (`binary_codes`, `hamming`, `nearest`, `top_k`: core/vectors.py, shared with skill retrieval) has
no state; `ScopeVectors` and `VectorIndex` hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from core.vectors import binary_codes, hamming, nearest, top_k
from memory.store import MemoryStore, ScopeChanges
from memory.units import Kind

__all__ = ["ScopeVectors", "VectorIndex", "adopt_encoder", "binary_codes", "hamming", "nearest", "top_k"]

log = logging.getLogger("clawray.memory")
KIND_CODE = {k: i for i, k in enumerate(Kind)}
HOLE = -1
# Vectors stored before the store recorded their encoder were made by the default transformer (the only
# encoder then): a store without a record is taken to hold this encoder's vectors.
LEGACY_ENCODER = "all-MiniLM-L6-v2"


def adopt_encoder(store: MemoryStore, encoder_id: str, encode: Callable[[list[str]], np.ndarray]) -> int:
    """Make the store's vectors `encoder_id`'s (the writer, at its start): re-encode every stored vector
    when the store's were made by another encoder. Returns how many were re-encoded (0: already its own)."""
    if (store.vector_encoder() or LEGACY_ENCODER) == encoder_id:
        return 0
    t0 = time.perf_counter()
    n = store.reencode(encoder_id, encode)
    log.info("memory vectors re-encoded with %s: %d units in %.1f s", encoder_id, n, time.perf_counter() - t0)
    return n


class ScopeVectors:
    """One scope's active unit vectors in growable buffers; removed rows become holes (kind HOLE, zero
    vector) until they exceed a quarter of the rows, then the buffers are compacted."""

    def __init__(self, dim: int):
        self.dim = dim
        self._reset()

    def _reset(self) -> None:
        dim = self.dim
        self.seq = -1  # the store's version of the scope this copy reflects (-1: never synced)
        self.encoder: str | None = None  # the encoder of the store's vectors at that version
        self.buf = np.zeros((0, dim), dtype=np.float32)
        self.codes_t = np.zeros(((dim + 63) // 64, 0), dtype=np.uint64)  # (W, capacity): word-major
        self.kinds = np.zeros(0, dtype=np.int8)
        self.ids: list[str | None] = []
        self.row: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.row)

    def apply(self, ch: ScopeChanges) -> None:
        if ch.rebuild:
            self._reset()
        for uid in ch.deleted:
            self._remove(uid)
        fresh: list[tuple[str, int, np.ndarray]] = []
        for uid, kind, blob, active in ch.rows:
            vec = np.frombuffer(blob, dtype="<f4") if blob is not None else None
            if not active or vec is None or vec.shape[0] != self.dim:
                self._remove(uid)
            elif uid in self.row:
                i = self.row[uid]
                self.buf[i], self.codes_t[:, i], self.kinds[i] = vec, binary_codes(vec[None])[0], KIND_CODE[Kind(kind)]
            else:
                fresh.append((uid, KIND_CODE[Kind(kind)], vec))
        self._append(fresh)
        holes = len(self.ids) - len(self.row)
        if holes and holes * 4 > len(self.ids):
            self._compact()
        self.seq, self.encoder = ch.seq, ch.encoder

    def _remove(self, uid: str) -> None:
        i = self.row.pop(uid, None)
        if i is not None:
            self.ids[i], self.kinds[i] = None, HOLE
            self.buf[i], self.codes_t[:, i] = 0.0, 0

    def _append(self, fresh: list[tuple[str, int, np.ndarray]]) -> None:
        if not fresh:
            return
        n, need = len(self.ids), len(self.ids) + len(fresh)
        if need > self.buf.shape[0]:
            cap = max(need, 2 * self.buf.shape[0], 64)
            self.buf = _grow(self.buf, cap, n, 0)
            self.codes_t = _grow(self.codes_t.T, cap, n, 0).T.copy()
            self.kinds = _grow(self.kinds, cap, n, HOLE)
        vecs = np.stack([v for _, _, v in fresh])
        self.buf[n:need], self.codes_t[:, n:need] = vecs, binary_codes(vecs).T
        self.kinds[n:need] = [k for _, k, _ in fresh]
        for j, (uid, _, _) in enumerate(fresh):
            self.row[uid] = n + j
            self.ids.append(uid)

    def _compact(self) -> None:
        live = np.array([i for i, u in enumerate(self.ids) if u is not None], dtype=np.int64)
        self.buf, self.kinds = self.buf[live].copy(), self.kinds[live].copy()
        self.codes_t = np.ascontiguousarray(self.codes_t[:, live])
        self.ids = [self.ids[i] for i in live.tolist()]
        self.row = {u: i for i, u in enumerate(self.ids) if u is not None}

    def search(self, q: np.ndarray, qcode: np.ndarray, k: int, kind: Kind | None, exact_limit: int,
               rescore: int, min_rescore: int) -> list[tuple[str, float]]:
        """(unit id, cosine) of the best `k` rows (of `kind` if given), best first."""
        n = len(self.ids)
        if n == 0 or k <= 0:
            return []
        if n <= exact_limit:
            cand = np.arange(n)
        else:
            m = min(n, max(min_rescore, rescore * k))  # the candidates' order does not matter: rescored
            cand = nearest(hamming(self.codes_t[:, :n], qcode), m)
        sims = np.einsum("ij,j->i", self.buf[cand], q)  # einsum: single-threaded (see evolve/retrieval.py)
        live = self.kinds[cand] != HOLE if kind is None else self.kinds[cand] == KIND_CODE[kind]
        sims = np.where(live, sims, -np.inf)
        best = top_k(sims, min(k, int(live.sum())))
        return [(self.ids[int(cand[i])], float(sims[i])) for i in best]  # type: ignore[misc]

    def vector(self, uid: str) -> np.ndarray | None:
        i = self.row.get(uid)
        return None if i is None else self.buf[i].copy()


def _grow(a: np.ndarray, cap: int, n: int, fill: int) -> np.ndarray:
    out = np.full((cap, *a.shape[1:]), fill, dtype=a.dtype)
    out[:n] = a[:n]
    return out


class VectorIndex:
    """Scopes' vectors cached from `store`, least recently used scopes dropped past `max_rows` in all.

    Thread-safe. `search` first asks the store for the scopes' versions (one query, or the caller's
    `versions`) and catches up the scopes that changed, so a forget or a supersession is honoured by the
    next search. `encoder_id`: the queries' encoder; scopes whose vectors were recorded as another
    encoder's are skipped (None: not checked).
    """

    def __init__(self, store: MemoryStore, dim: int, *, exact_limit: int = 20000, rescore: int = 10,
                 min_rescore: int = 256, max_rows: int = 1_000_000, encoder_id: str | None = None):
        self.store, self.dim, self.encoder_id = store, dim, encoder_id
        self._warned: str | None = None
        self.exact_limit, self.rescore, self.min_rescore, self.max_rows = exact_limit, rescore, min_rescore, max_rows
        self._scopes: OrderedDict[str, ScopeVectors] = OrderedDict()
        self._lock = threading.Lock()

    def _sync(self, keys: list[str], versions: dict[str, int] | None = None) -> list[ScopeVectors]:
        versions = self.store.scope_versions(keys) if versions is None else versions
        out = []
        for key in keys:
            if key not in versions:
                self._scopes.pop(key, None)  # no such scope (any more)
                continue
            sv = self._scopes.get(key)
            if sv is None:
                sv = self._scopes[key] = ScopeVectors(self.dim)
            if sv.seq != versions[key]:
                sv.apply(self.store.scope_changes(key, sv.seq))
            self._scopes.move_to_end(key)
            if self._usable(sv):
                out.append(sv)
        total = sum(len(s.ids) for s in self._scopes.values())
        for key in list(self._scopes):
            if total <= self.max_rows or key in keys:
                break
            total -= len(self._scopes.pop(key).ids)
        return out

    def _usable(self, sv: ScopeVectors) -> bool:
        """False when the scope's vectors are another encoder's (warned once per encoder seen)."""
        if sv.encoder is None or self.encoder_id is None or sv.encoder == self.encoder_id:
            return True
        if self._warned != sv.encoder:
            self._warned = sv.encoder
            log.warning("memory vectors were made by encoder %s, queries by %s: vector search is off until "
                        "the Memory actor re-encodes them (it does at its start)", sv.encoder, self.encoder_id)
        return False

    def search(self, keys: list[str], q: np.ndarray, k: int, kind: Kind | None = None,
               versions: dict[str, int] | None = None) -> list[tuple[str, float]]:
        """The best `k` (unit id, cosine) over the scopes `keys`, best first. `versions`: the scopes'
        versions when the caller has just read them (saves a query)."""
        qcode = binary_codes(q[None])[0]
        with self._lock:
            hits = [h for sv in self._sync(keys, versions) for h in sv.search(
                q, qcode, k, kind, self.exact_limit, self.rescore, self.min_rescore)]
        hits.sort(key=lambda h: -h[1])
        return hits[:k]

    def vector(self, key: str, uid: str) -> np.ndarray | None:
        with self._lock:
            svs = self._sync([key])
            return svs[0].vector(uid) if svs else None
