"""The sentence-transformers MiniLM pipeline on onnxruntime: the same weights, the same vectors, less overhead.

A single-query torch forward of all-MiniLM-L6-v2 costs ~14 ms on one CPU thread however short the query
(per-operator overhead dominates); onnxruntime runs the same graph with fused kernels. The transformer
is exported once per model folder with `torch.onnx.export` into `<cache_dir>/onnx/` (under a file lock:
several replicas may start at once; never committed); tokenisation uses the model's own `tokenizer.json`
(the fast tokenizer sentence-transformers wraps), and mean pooling + L2 normalisation run in numpy
exactly as the sentence-transformers modules do. An export is kept only when its vectors match the torch
pipeline's on probe texts (cosine >= `PARITY_MIN`, identical token ids), so stored vectors stay valid
whichever path encoded them. Anything else (not mean pooling, no `tokenizer.json`, onnxruntime missing)
raises `OnnxUnavailable`; `evolve.embedding.SentenceEmbedder` then falls back to torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1  # bump when the exported graph or the sidecar changes: old files are then ignored
PARITY_MIN = 0.9999
OPSET = 17
SENTENCE_OUTPUT = "sentence_embedding"  # a graph with this output pools and normalises itself, one text per run
PROBES = [  # short and long, padded in one batch, odd whitespace, unicode, the empty string
    "hi", "", "  leading and trailing spaces  ", "Which text editor do I use on the kalomi project?",
    "The user's timezone is Europe/Paris.", "Ünïcödé ✓ 日本語 🎉 naïve café", "tabs\tand\nnewlines",
    " ".join(["a long text past the sequence limit"] * 60),
]


class OnnxUnavailable(RuntimeError):
    """The ONNX path cannot serve this model here (the reason is the message)."""


def cache_key(model_dir: Path) -> str:
    """Stable id of a model folder's files (names, sizes, mtimes) and of this module's export format."""
    h = hashlib.sha256(f"format={FORMAT};opset={OPSET}".encode())
    for p in sorted(model_dir.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(model_dir)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def artefact_paths(model_dir: Path, cache_dir: Path) -> tuple[Path, Path]:
    """(graph.onnx, sidecar.json) of `model_dir` under `cache_dir`."""
    base = cache_dir / "onnx" / f"{'-'.join(model_dir.parts[-2:])}-{cache_key(model_dir)}"  # e.g. <package>-model
    return base.with_suffix(".onnx"), base.with_suffix(".json")


def mean_pool_normalise(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling(mean) then Normalize: masked mean over tokens, then unit L2 rows.

    Same clamps as the torch modules (token count >= 1e-9, norm >= 1e-12), float32 throughout.
    """
    m = mask[..., None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    pooled = summed / np.maximum(m.sum(axis=1), 1e-9)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class OnnxEncoder:
    """Texts -> unit vectors through an exported transformer. `InferenceSession.run` is thread-safe and
    releases the GIL, so no lock is needed and a helper thread overlaps it with other work."""

    def __init__(self, onnx_path: Path, meta: dict[str, Any], model_dir: Path, threads: int = 1):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        opts = ort.SessionOptions()
        # One thread, as torch in Ray workers (OMP_NUM_THREADS=1): a replica must not take every core.
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tok.enable_truncation(int(meta["max_seq_length"]))
        self._tok.enable_padding(pad_id=int(meta["pad_id"]), pad_token=str(meta["pad_token"]))
        # The graph's own inputs (a subset of the tokenizer's: the int8 query graph takes input_ids only).
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._pooled = self._session.get_outputs()[0].name == SENTENCE_OUTPUT  # evolve/int8_graph.py QueryGraph
        self.dim = int(meta["dim"])

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """The ids fed to the graph (padded to the longest), for the parity check."""
        return [e.ids for e in self._tok.encode_batch(texts)]

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """(N, dim) float32 unit rows; batches of similar length (as sentence-transformers) pad little."""
        if self._pooled:
            return np.stack([self.encode_one(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for i in range(0, len(texts), batch_size):
            idx = order[i:i + batch_size]
            out[idx] = self._batch([texts[j] for j in idx])
        return out

    def encode_one(self, text: str) -> np.ndarray:
        """(dim,) float32 unit vector of one text: `encode([text])[0]` without the batching (no padding,
        so the mask is all ones and pooling is a plain mean); ~0.1 ms less per query."""
        enc = self._tok.encode(text)
        if self._pooled:
            return self._session.run(None, {"input_ids": np.asarray([enc.ids], dtype=np.int64)})[0][0]
        cols = {"input_ids": enc.ids, "attention_mask": enc.attention_mask, "token_type_ids": enc.type_ids}
        hidden = self._session.run(None, {n: np.asarray([cols[n]], dtype=np.int64) for n in self._inputs})[0]
        pooled = hidden[0].mean(axis=0, dtype=np.float32)
        return (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32, copy=False)

    def _batch(self, texts: list[str]) -> np.ndarray:
        enc = self._tok.encode_batch(texts)
        cols = {"input_ids": [e.ids for e in enc], "attention_mask": [e.attention_mask for e in enc],
                "token_type_ids": [e.type_ids for e in enc]}
        feeds = {name: np.asarray(cols[name], dtype=np.int64) for name in self._inputs}
        hidden = self._session.run(None, feeds)[0]
        return mean_pool_normalise(hidden, feeds["attention_mask"])


def load_or_export(model_dir: Path, cache_dir: Path, load_torch: Callable[[], Any]) -> OnnxEncoder:
    """The ONNX encoder of `model_dir`, exporting it first when the cache has none.

    `load_torch()` returns the sentence-transformers model; it is called only to export (then checked
    against it). Raises OnnxUnavailable when this model or environment cannot take the ONNX path.
    """
    if importlib.util.find_spec("onnxruntime") is None:
        raise OnnxUnavailable("onnxruntime is not installed")
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_err

    onnx_path, meta_path = artefact_paths(model_dir, cache_dir)
    try:
        if not onnx_path.is_file():
            onnx_path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(onnx_path.with_suffix(".lock")):
                if not onnx_path.is_file():  # another process may have exported it while we waited
                    _export_checked(load_torch(), model_dir, onnx_path, meta_path)
        return OnnxEncoder(onnx_path, json.loads(meta_path.read_text()), model_dir)
    except OnnxUnavailable:
        raise
    # The export traces arbitrary model code and ORT raises its own classes (not RuntimeError).
    except (OSError, RuntimeError, ValueError, KeyError, TypeError,
            ort_err.Fail, ort_err.InvalidArgument, ort_err.InvalidGraph, ort_err.InvalidProtobuf) as e:
        raise OnnxUnavailable(f"{type(e).__name__}: {e} (cache {onnx_path})") from e


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _export_checked(st: Any, model_dir: Path, onnx_path: Path, meta_path: Path) -> None:
    """Export to a temporary name, keep it only if it reproduces `st`'s vectors on PROBES."""
    meta = _pipeline_meta(st, model_dir)
    tmp = onnx_path.with_name(f".{onnx_path.stem}.{os.getpid()}.onnx")
    try:
        export_graph(st, meta["inputs"], tmp)
        enc = OnnxEncoder(tmp, meta, model_dir)
        _check_parity(st, enc)
        meta_path.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, onnx_path)  # the commit point: readers look for the .onnx file
    finally:
        tmp.unlink(missing_ok=True)


def _pipeline_meta(st: Any, model_dir: Path) -> dict[str, Any]:
    """What the numpy side must reproduce; refuses pipelines other than Transformer -> mean -> (Normalize)."""
    kinds = [type(m).__name__ for m in st]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise OnnxUnavailable(f"pipeline {kinds} is not Transformer -> Pooling [-> Normalize]")
    pooling = st[1].get_config_dict()
    if pooling.get("pooling_mode") != "mean" or not pooling.get("include_prompt", True):
        raise OnnxUnavailable(f"pooling {pooling} is not plain mean pooling")
    if not (model_dir / "tokenizer.json").is_file():
        raise OnnxUnavailable(f"{model_dir} has no tokenizer.json (fast tokenizer)")
    tok = st.tokenizer
    inputs = [n for n in tok.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")]
    if "input_ids" not in inputs or "attention_mask" not in inputs:
        raise OnnxUnavailable(f"tokenizer inputs {tok.model_input_names} are not a text encoder's")
    return {"format": FORMAT, "inputs": inputs, "max_seq_length": int(st.max_seq_length),
            "dim": int(st.get_embedding_dimension()), "pad_id": int(tok.pad_token_id),
            "pad_token": str(tok.pad_token)}


def export_graph(st: Any, inputs: list[str], path: Path, model: Any = None) -> None:
    """Export the token embeddings of `model` (default: `st`'s transformer) to `path`, dynamic batch and
    length. `model` takes `st`'s tokenizer inputs; it may use onnxruntime's com.microsoft ops
    (evolve/int8_graph.py does)."""
    import torch

    class Hidden(torch.nn.Module):  # the transformer's token embeddings, what Pooling consumes
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(inputs, tensors, strict=True))).last_hidden_state

    # Traced on a padded batch of two, so the attention-mask path is in the graph (not baked to "no mask").
    sample = st.preprocess(["a padded sample", "a longer sample so that the first one is padded"])
    axes = {n: {0: "batch", 1: "tokens"} for n in [*inputs, "last_hidden_state"]}
    opsets = {"custom_opsets": {"com.microsoft": 1}} if model is not None else {}
    model = st[0].auto_model if model is None else model
    with torch.no_grad(), _without_onnx_package(), warnings.catch_warnings():
        # The tracer warns about shape checks it freezes and the legacy exporter about itself; the export
        # is checked against torch on PROBES (padded batches, past the length limit) instead.
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(model).eval(), tuple(sample[n] for n in inputs), str(path),
                          dynamo=False, input_names=inputs, output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=OPSET, **opsets)


@contextlib.contextmanager
def _without_onnx_package() -> Iterator[None]:
    """Let torch's TorchScript exporter run without the `onnx` package.

    It imports `onnx` for one step only: splicing custom onnxscript functions into the proto, and this
    graph has none (no custom opsets), so the step is the identity. The export is then checked against
    torch on PROBES, so a change in this private hook cannot slip wrong vectors through.
    """
    if importlib.util.find_spec("onnx") is not None:
        yield
        return
    from unittest import mock

    from torch.onnx._internal.torchscript_exporter import onnx_proto_utils

    with mock.patch.object(onnx_proto_utils, "_add_onnxscript_fn", lambda proto, _opsets: proto):
        yield


def _check_parity(st: Any, enc: OnnxEncoder) -> None:
    want_ids = st.preprocess(PROBES)["input_ids"].tolist()
    if enc.token_ids(PROBES) != want_ids:
        raise OnnxUnavailable("tokenizer.json does not tokenise as the sentence-transformers tokenizer")
    want = st.encode(PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    cos = (enc.encode(PROBES) * np.asarray(want, dtype=np.float32)).sum(axis=1)
    if float(cos.min()) < PARITY_MIN:
        raise OnnxUnavailable(f"exported graph drifts from torch: min cosine {float(cos.min()):.6f}")
