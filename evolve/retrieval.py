"""Skill retrieval (MetaClaw's two modes) and the block the Proxy injects into the system message.

- `template`: keyword task-type detection picks a category; returns the best `task_specific_top_k`
  skills of that category and the best `top_k` general skills, ranked by query-token overlap.
- `embedding`: cosine similarity between the query and each skill (all-MiniLM-L6-v2 by default);
  best `top_k` general skills and best `task_specific_top_k` of the other categories.

`build(skills)` returns an immutable index (swapped in whole, so `retrieve` may run concurrently);
the scoring itself is pure numpy (`overlap_scores`, `cosine_scores`, `top_k_indices`; a large library's
embedding search is prefiltered by sign bits first: `PREFILTER_MIN`), except template retrieval on a small
library, which ranks the same way in plain Python (`SMALL_LIBRARY`).
`SkillSearch` is the read side for the Proxy: `refresh()` once a second, `lookup(query)` per request,
which returns the skills together with the generation of the library they came from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from core.config import SkillsConfig
from core.contracts import Skill
from core.vectors import binary_codes, hamming, nearest, top_k
from evolve.bank import SkillBank
from evolve.embedding import Embedder, EmbeddingCache, SentenceEmbedder
from evolve.scopes import split_by_scope
from evolve.skill_md import content_key
from evolve.text import GENERAL_CATEGORIES, detect_task_type, tokenize

log = logging.getLogger(__name__)

class Retriever(Protocol):
    def build(self, skills: Sequence[Skill]) -> object:
        """Index `skills` (the whole library); cheap for skills seen before. Returns the immutable index,
        which also becomes the retriever's current one."""
        ...

    def retrieve(self, query: str, top_k: int, task_specific_top_k: int, index: object = None) -> list[Skill]:
        """Best skills for `query` from `index` (a value `build` returned; default: the current one)."""
        ...


# ------------------------------------------------------------------------------------ pure scoring
def top_k_indices(scores: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """The `k` best of `candidates` (ascending indices into `scores`), by score desc, then index asc.

    scores: (N,) float; candidates: (C,) int, sorted ascending. Returns (min(k, C),) int. O(C).
    """
    return candidates[top_k(scores[candidates], k)]  # ascending candidates: a lower position = a lower index


def cosine_scores(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(N, D) unit rows x (D,) unit query -> (N,) cosine similarities.

    NOTE: einsum, not `matrix @ query`: a matrix-vector product is memory-bound, and BLAS's worker
    threads must be woken per call; on a loaded 2-core machine that took ~8 ms p50 at 10k skills
    against ~0.8 ms single-threaded (measured, benchmarks/retrieval.py).
    """
    return np.einsum("ij,j->i", matrix, query)


def overlap_scores(post_ids: np.ndarray, post_rows: np.ndarray, query_ids: np.ndarray, n: int) -> np.ndarray:
    """Number of distinct query tokens each of `n` skills contains -> (n,) float32.

    post_ids/post_rows: (M,) token id and skill row of every (skill, distinct token) pair, sorted by id.
    """
    if query_ids.size == 0 or post_ids.size == 0:
        return np.zeros(n, dtype=np.float32)
    lo = np.searchsorted(post_ids, query_ids, "left")
    hi = np.searchsorted(post_ids, query_ids, "right")
    rows = [post_rows[a:b] for a, b in zip(lo, hi, strict=True) if b > a]
    if not rows:
        return np.zeros(n, dtype=np.float32)
    return np.bincount(np.concatenate(rows), minlength=n).astype(np.float32)


# ------------------------------------------------------------------------------------ retrievers
class _KeyMemo:
    """content_key per Skill object, memoised by identity: the bank hands out the same object for an
    unchanged skill, so a rebuild after one change hashes one skill, not the whole library."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Skill, str]] = {}

    def keys(self, skills: Sequence[Skill]) -> list[str]:
        memo: dict[int, tuple[Skill, str]] = {}
        out = []
        for s in skills:
            hit = self._memo.get(id(s))
            key = hit[1] if hit is not None and hit[0] is s else content_key(s)
            memo[id(s)] = (s, key)
            out.append(key)
        self._memo = memo
        return out


@dataclass(frozen=True)
class _Groups:
    skills: tuple[Skill, ...]
    general: np.ndarray  # (G,) indices of general / common_mistakes skills
    task: np.ndarray  # (T,) indices of all other skills
    by_category: dict[str, np.ndarray]  # category -> indices (task categories only)


def _groups(skills: Sequence[Skill]) -> _Groups:
    cats = [s.category for s in skills]
    general = np.array([i for i, c in enumerate(cats) if c in GENERAL_CATEGORIES], dtype=np.int64)
    task = np.array([i for i, c in enumerate(cats) if c not in GENERAL_CATEGORIES], dtype=np.int64)
    by_cat: dict[str, list[int]] = {}
    for i in task.tolist():
        by_cat.setdefault(cats[i], []).append(i)
    return _Groups(tuple(skills), general, task,
                   {c: np.array(ix, dtype=np.int64) for c, ix in by_cat.items()})


# Up to this many skills, template retrieval scores and ranks in plain Python: on a small library numpy's
# per-call overhead (~20 calls per query) was most of the lookup (~95 us at 36 skills; ~30 us without).
# Both paths rank alike (tests/unit/test_evolve_retrieval_small.py).
SMALL_LIBRARY = 256


@dataclass(frozen=True)
class _Small:
    """A small library's index as Python containers."""

    postings: dict[int, tuple[int, ...]]  # token id -> the rows of the skills that contain it
    general: tuple[int, ...]
    by_category: dict[str, tuple[int, ...]]


def _small(groups: _Groups, ids: np.ndarray, rows: np.ndarray) -> _Small:
    postings: dict[int, list[int]] = {}
    for t, r in zip(ids.tolist(), rows.tolist(), strict=True):
        postings.setdefault(t, []).append(r)
    return _Small({t: tuple(rs) for t, rs in postings.items()}, tuple(groups.general.tolist()),
                  {c: tuple(ix.tolist()) for c, ix in groups.by_category.items()})


def _best(scores: list[int], candidates: tuple[int, ...], k: int) -> list[int]:
    """`top_k_indices` in Python: by score desc, then index asc (a stable sort of ascending candidates)."""
    return sorted(candidates, key=lambda i: -scores[i])[:k] if k > 0 else []


class TemplateRetriever:
    """Keyword task-type detection + token-overlap ranking; no model. Token sets cached per content."""

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}
        self._tok_cache: dict[str, np.ndarray] = {}  # content_key -> (t,) distinct token ids
        self._keys = _KeyMemo()
        self._index: tuple[_Groups, np.ndarray, np.ndarray, _Small | None] | None = None

    def _token_ids(self, skill: Skill, key: str) -> np.ndarray:
        ids = self._tok_cache.get(key)
        if ids is None:
            toks = set(tokenize(f"{skill.name.replace('-', ' ')} {skill.description} {skill.body}"))
            ids = np.array(sorted(self._vocab.setdefault(t, len(self._vocab)) for t in toks), dtype=np.int32)
            self._tok_cache[key] = ids
        return ids

    def build(self, skills: Sequence[Skill]) -> tuple[_Groups, np.ndarray, np.ndarray, _Small | None]:
        groups = _groups(skills)
        keys = self._keys.keys(skills)
        per_skill = [self._token_ids(s, k) for s, k in zip(skills, keys, strict=True)]
        if per_skill:
            ids = np.concatenate(per_skill)
            rows = np.repeat(np.arange(len(per_skill)), [a.size for a in per_skill])
            order = np.argsort(ids)  # order within one token id is irrelevant to the counts
            ids, rows = ids[order], rows[order]
        else:
            ids, rows = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        if len(self._tok_cache) > 1.25 * len(keys) + 64:  # forget removed skills now and then
            live = set(keys)
            self._tok_cache = {k: v for k, v in self._tok_cache.items() if k in live}
        self._index = (groups, ids, rows, _small(groups, ids, rows) if len(skills) <= SMALL_LIBRARY else None)
        return self._index

    def retrieve(self, query: str, top_k: int, task_specific_top_k: int,
                 index: tuple[_Groups, np.ndarray, np.ndarray, _Small | None] | None = None) -> list[Skill]:
        index = self._index if index is None else index
        if index is None or not index[0].skills:  # empty library: no tokenizing per request
            return []
        groups, post_ids, post_rows, small = index
        tokens = tokenize(query)
        task = detect_task_type(query, available=groups.by_category, tokens=tokens)
        if small is not None:
            scores = [0] * len(groups.skills)
            for t in {self._vocab[t] for t in tokens if t in self._vocab}:
                for r in small.postings.get(t, ()):
                    scores[r] += 1
            picked = _best(scores, small.general, top_k)
            if task is not None:
                picked += _best(scores, small.by_category[task], task_specific_top_k)
            return [groups.skills[i] for i in picked]
        q_ids = np.array(sorted({self._vocab[t] for t in tokens if t in self._vocab}), dtype=np.int32)
        scores = overlap_scores(post_ids, post_rows, q_ids, len(groups.skills))
        picked = list(top_k_indices(scores, groups.general, top_k))
        if task is not None:
            picked += list(top_k_indices(scores, groups.by_category[task], task_specific_top_k))
        return [groups.skills[i] for i in picked]


# A library of at least PREFILTER_MIN skills is searched in two steps (core/vectors.py): the Hamming
# distance of every skill's sign bits to the query's picks the `prefilter_candidates(k)` nearest, and only
# those are scored exactly. Why: the exact scan of 10,000 x 384 fp32 vectors reads 15 MB per query (~0.55
# ms of a ~0.7 ms search here); the bits read 480 KB. Below PREFILTER_MIN the exact scan is cheaper than
# the extra passes. How often the prefiltered top-k equals the exact one: benchmarks/retrieval.py.
PREFILTER_MIN = 4096
PREFILTER_FLOOR, PREFILTER_PER_SKILL = 512, 32


def prefilter_candidates(k: int) -> int:
    """How many nearest codes are scored exactly when `k` skills are wanted in all."""
    return max(PREFILTER_FLOOR, PREFILTER_PER_SKILL * k)


@dataclass(frozen=True)
class _VectorIndex:
    groups: _Groups
    matrix: np.ndarray  # (N, D) unit rows, in the order of groups.skills
    codes_t: np.ndarray | None  # (D/64, N) uint64 sign bits, word-major; None: exact scan (N < PREFILTER_MIN)
    general: np.ndarray  # (N,) bool: the row is a general / common_mistakes skill


class EmbeddingRetriever:
    """Cosine similarity over cached skill embeddings; only the query is encoded per call."""

    def __init__(self, cache: EmbeddingCache, prefilter_min: int = PREFILTER_MIN):
        self.cache = cache
        self.prefilter_min = prefilter_min
        self._keys = _KeyMemo()
        self._index: _VectorIndex | None = None

    def build(self, skills: Sequence[Skill]) -> _VectorIndex:
        groups = _groups(skills)
        matrix = self.cache.skill_matrix(list(skills), self._keys.keys(skills))
        codes_t = np.ascontiguousarray(binary_codes(matrix).T) if len(skills) >= self.prefilter_min else None
        general = np.zeros(len(skills), dtype=bool)
        general[groups.general] = True
        self._index = _VectorIndex(groups, matrix, codes_t, general)
        return self._index

    def encode(self, query: str) -> np.ndarray:
        return self.cache.encode_query(query)

    def retrieve(self, query: str, top_k: int, task_specific_top_k: int,
                 index: _VectorIndex | None = None) -> list[Skill]:
        index = self._index if index is None else index
        if index is None or not index.groups.skills:
            return []
        return self.retrieve_vector(self.encode(query), top_k, task_specific_top_k, index)

    def retrieve_vector(self, query_vec: np.ndarray, top_k: int, task_specific_top_k: int,
                        index: _VectorIndex | None = None) -> list[Skill]:
        """`retrieve` with the query already encoded ((D,) unit vector)."""
        index = self._index if index is None else index
        if index is None:
            return []
        groups = index.groups
        if index.codes_t is None:
            scores = cosine_scores(index.matrix, query_vec)
            general, task = groups.general, groups.task
        else:
            m = prefilter_candidates(max(top_k, 0) + max(task_specific_top_k, 0))
            cand = nearest(hamming(index.codes_t, binary_codes(query_vec[None])[0]), m)  # ascending
            scores = np.empty(index.matrix.shape[0], dtype=np.float32)
            scores[cand] = cosine_scores(index.matrix[cand], query_vec)
            is_general = index.general[cand]
            general, task = cand[is_general], cand[~is_general]
        picked = list(top_k_indices(scores, general, top_k))
        picked += list(top_k_indices(scores, task, task_specific_top_k))
        return [groups.skills[i] for i in picked]


RETRIEVERS: dict[str, Callable[[EmbeddingCache | None], Retriever]] = {
    "template": lambda cache: TemplateRetriever(),
    "embedding": lambda cache: EmbeddingRetriever(_require(cache)),
}


def _require(cache: EmbeddingCache | None) -> EmbeddingCache:
    if cache is None:
        raise ValueError("embedding retrieval needs an embedder (see evolve.embedding.SentenceEmbedder)")
    return cache


def make_retriever(mode: str, embedder: Embedder | EmbeddingCache | None = None) -> Retriever:
    """A retriever by name; unknown names raise ValueError listing the valid ones."""
    if mode not in RETRIEVERS:
        raise ValueError(f"unknown retrieval mode {mode!r}; valid: {', '.join(sorted(RETRIEVERS))}")
    cache = embedder if embedder is None or isinstance(embedder, EmbeddingCache) else EmbeddingCache(embedder)
    return RETRIEVERS[mode](cache)


# ------------------------------------------------------------------------------------ injection
def render_skills_block(skills: Sequence[Skill]) -> str:
    """Markdown block of `skills` for the system message ("" when there are none)."""
    if not skills:
        return ""
    parts = ["## Active Skills", "Apply the skills below when they are relevant to the request."]
    for s in skills:
        desc, body = s.description.strip(), s.body.strip()
        # A lesson's description is its rule, which its body states again (evolve/evolvers.py): the block is
        # injected into every matching turn, so the rule is said once.
        parts.append(f"### {s.name}" if desc and desc in body else f"### {s.name}\n_{desc}_")
        if body:
            parts.append(body)
    return "\n\n".join(parts)


@dataclass(frozen=True)
class LibrarySnapshot:
    """One built library: the bank version and skill generation it was read at, and its index (of the
    global skills). Private skills (evolve/scopes.py) are kept by scope; an index over the private skills
    a request can see is built on first use and cached with the snapshot."""

    version: int
    generation: int
    index: object  # what `Retriever.build` returned for the library's global skills
    private: dict[str, tuple[Skill, ...]] = field(default_factory=dict)  # scope -> its skills
    scoped: dict[tuple[str, ...], object] = field(default_factory=dict)  # scopes -> index of their skills


MAX_SCOPED_INDEXES = 4096  # private indexes cached per library snapshot (one per distinct set of scopes)


class SkillSearch:
    """Read side for the Proxy: a SkillBank plus a retriever kept in sync with it.

    `refresh()` is meant to be called on every request (or once a second): it does nothing until
    `cfg.refresh_s` passed since the last check, then reloads the bank (cheap when unchanged) and
    rebuilds the index only if the library changed. The built index and the generation it came from
    are swapped in as ONE `LibrarySnapshot`, and `lookup` reads that snapshot once, so the generation
    recorded on a turn is always the generation of the skills it was served with (issue 12 item 8),
    whatever refresh runs meanwhile (another request, or a worker thread in embedding mode).
    """

    def __init__(self, bank: SkillBank, cfg: SkillsConfig, embedder: Embedder | EmbeddingCache | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.bank, self.cfg, self._clock = bank, cfg, clock
        if cfg.retrieval == "embedding" and embedder is None:
            embedder = bank.cache or SentenceEmbedder(cfg.embedding_model, encoder=cfg.embedding_encoder)
        self.retriever = make_retriever(cfg.retrieval, embedder)
        # Private skills are indexed by a retriever of their own: building a small index must not prune the
        # global one's caches (template retrieval), and an index is only searched by its own retriever.
        self._own = make_retriever(cfg.retrieval, getattr(self.retriever, "cache", None))
        self._snapshot = LibrarySnapshot(-1, 0, None)
        self._checked_at = float("-inf")
        self._refreshing = threading.Lock()  # one rebuild at a time (retrievers' caches are not thread-safe)
        self.refresh(force=True)

    @property
    def generation(self) -> int:
        """The skill generation the current index was built from."""
        return self._snapshot.generation

    def refresh(self, force: bool = False) -> bool:
        """Pick up a new library if there is one; True when the index was rebuilt.

        A caller that finds another refresh running returns at once (False) and serves the current
        snapshot: requests never wait for someone else's rebuild.
        """
        now = self._clock()
        if not force and now - self._checked_at < self.cfg.refresh_s:
            return False
        if not self._refreshing.acquire(blocking=force):
            return False
        try:
            self._checked_at = now
            self.bank.reload()
            version, generation, skills = self.bank.snapshot()
            if version == self._snapshot.version:
                return False
            shared, private, bad = split_by_scope(skills)
            if bad:
                log.warning("skills with an invalid metadata.scope are served to no one: %s", ", ".join(bad[:10]))
            self._snapshot = LibrarySnapshot(version, generation, self.retriever.build(shared),
                                             {k: tuple(v) for k, v in private.items()})
            return True
        finally:
            self._refreshing.release()

    def lookup(self, query: str, top_k: int | None = None, task_specific_top_k: int | None = None,
               scopes: frozenset[str] | None = None) -> tuple[list[Skill], int]:
        """(skills for `query`, the generation of the library they came from), from one snapshot.
        `scopes`: the private scopes the request sees (evolve/scopes.py `request_scopes`); their skills
        rank first, then the global ones, `top_k + task_specific_top_k` in all. None: global skills only."""
        snap = self._snapshot  # read once: skills and generation of the same library
        if not self.cfg.enabled or snap.index is None:
            return [], snap.generation
        k = self.cfg.top_k if top_k is None else top_k
        tk = self.cfg.task_specific_top_k if task_specific_top_k is None else task_specific_top_k
        keys = tuple(sorted(x for x in scopes or () if x in snap.private))
        if not keys:  # the common case: no private skill for this request
            return self.retriever.retrieve(query, k, tk, index=snap.index), snap.generation
        own_index = snap.scoped.get(keys)
        if own_index is None:
            own_index = self._build_scoped(snap, keys)
        if isinstance(self.retriever, EmbeddingRetriever):  # encode the query once for both searches
            vec = self.retriever.encode(query)
            own = self._own.retrieve_vector(vec, k, tk, own_index)  # type: ignore[attr-defined]
            shared = self.retriever.retrieve_vector(vec, k, tk, snap.index)
        else:
            own = self._own.retrieve(query, k, tk, index=own_index)
            shared = self.retriever.retrieve(query, k, tk, index=snap.index)
        names = {s.name for s in own}
        return [*own, *(s for s in shared if s.name not in names)][: k + tk], snap.generation

    def _build_scoped(self, snap: LibrarySnapshot, keys: tuple[str, ...]) -> object:
        with self._refreshing:  # retrievers' caches are not thread-safe
            index = snap.scoped.get(keys)
            if index is None:
                if len(snap.scoped) >= MAX_SCOPED_INDEXES:
                    snap.scoped.clear()
                index = snap.scoped[keys] = self._own.build([s for key in keys for s in snap.private[key]])
            return index

    def retrieve(self, query: str, top_k: int | None = None, task_specific_top_k: int | None = None,
                 scopes: frozenset[str] | None = None) -> list[Skill]:
        return self.lookup(query, top_k, task_specific_top_k, scopes)[0]
