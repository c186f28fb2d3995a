"""A static-embedding query encoder: a model2vec distillation of the sentence-transformers model.

One MiniLM forward costs several milliseconds on a CPU core however short the text (evolve/onnx_encoder.py);
a static model is a table lookup and a mean: one vector per token (each token run once through the
transformer at distillation, reduced by PCA, weighted by its frequency rank), averaged over the text's
tokens, ~0.1 ms a query. The price is quality: a bag of tokens, no context (recall@k against MiniLM on a
labelled set: benchmarks/retrieval.py, tests/unit/test_evolve_encoders.py).

Its vectors are NOT in MiniLM's space, so whatever is compared with its queries (skills, memory units) is
encoded with it too: the encoder is a configuration choice (`embedding_encoder: static`), and stored
vectors record which encoder made them (`encoder_id`, memory/index.py). The distillation runs once per
model folder (a few minutes on 2 cores; `make setup` does it) into `<cache_dir>/static/` under a file lock,
offline (the local model folder), never committed. `encoder_id` fingerprints the distilled table: a
distillation on another machine may round differently, and its vectors must not be mixed with these.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np

from evolve.onnx_encoder import cache_key, file_lock

FORMAT = 1  # bump when the distillation settings change: older folders are then ignored
PCA_DIMS = 256  # model2vec's default; measured slightly better than no PCA on the labelled skill queries
MAX_TOKENS = 256  # MiniLM's own input limit: a static encode reads no more of a text than MiniLM would


class StaticUnavailable(RuntimeError):
    """The static encoder cannot be built or loaded here (the reason is the message)."""


def model_dir_of(model_dir: Path, cache_dir: Path) -> Path:
    """The distilled model's folder for `model_dir` under `cache_dir`."""
    key = hashlib.sha256(f"{cache_key(model_dir)};static={FORMAT};pca={PCA_DIMS}".encode()).hexdigest()[:16]
    return cache_dir / "static" / f"{'-'.join(model_dir.parts[-2:])}-{key}"


class StaticEncoder:
    """Texts -> unit vectors through a distilled static model. Read-only after load: thread-safe."""

    def __init__(self, path: Path, base_name: str):
        from model2vec import StaticModel

        self._model = StaticModel.from_pretrained(str(path))
        self.dim = int(self._model.dim)
        digest = hashlib.sha256(np.ascontiguousarray(self._model.embedding).tobytes()).hexdigest()[:12]
        self.encoder_id = f"{base_name}+static{PCA_DIMS}-{digest}"

    def encode(self, texts: list[str], batch_size: int = 1024) -> np.ndarray:
        """(N, dim) float32 unit rows (an empty or all-unknown text gives a zero row, as model2vec does)."""
        # No worker processes: this runs inside Ray workers and request threads.
        out = self._model.encode(texts, max_length=MAX_TOKENS, batch_size=batch_size, use_multiprocessing=False)
        out = np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)  # float16 tables: renormalise in float32


def load_or_distill(model_dir: Path, cache_dir: Path, base_name: str) -> StaticEncoder:
    """The static encoder of `model_dir`, distilling it first when `cache_dir` has none."""
    if importlib.util.find_spec("model2vec") is None:
        raise StaticUnavailable("the static encoder needs the model2vec package (pip install model2vec)")
    path = model_dir_of(model_dir, cache_dir)
    if not (path / "config.json").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path.with_suffix(".lock")):
            if not (path / "config.json").is_file():  # another process may have built it while we waited
                distill_into(model_dir, path)
    return StaticEncoder(path, base_name)


def distill_into(model_dir: Path, path: Path) -> None:
    """Distil `model_dir` into `path` (written under a temporary name, renamed when complete)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never the hub
    try:
        from model2vec.distill import distill
    except ImportError as e:  # model2vec without its torch/transformers/skeletoken side
        raise StaticUnavailable(f"model2vec cannot distil here: {e}") from e
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = distill(model_name=str(model_dir), pca_dims=PCA_DIMS, device="cpu")
        model.save_pretrained(str(tmp))
        (tmp / "clawray.json").write_text(json.dumps({"format": FORMAT, "source": str(model_dir)}))
        os.replace(tmp, path)  # the commit point: readers look for config.json in `path`
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
