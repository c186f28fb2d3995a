"""The query encoder on int8: MiniLM's transformer with int8 weights and activations quantised per call.

Why: an fp32 MiniLM forward of a short query costs ~3.5 ms on one idle core of this machine (~13 ms on a
busy one) on onnxruntime, most of it the 36 fp32 matrix products (42 MB of weights read per call). The
same graph with int8 weights runs each product as onnxruntime's `DynamicQuantizeMatMul` (the activations
quantised to uint8 per call, an integer GEMM on the CPU's VNNI/AMX units): ~2.5x faster per query.

Quality: BERT's activations have outlier channels that one int8 scale per matrix flattens. SmoothQuant
(Xiao et al., 2023) moves part of that range into the weights, exactly: x W^T = (x / s)(W diag(s))^T with
s_j = max|x_j|^ALPHA / max|W_j|^(1 - ALPHA), max|x_j| measured on CALIBRATION texts (ALPHA = 0.6 measured
best: mean cosine to fp32 0.995 against 0.992 without, worst 0.988 against 0.970). The word-embedding
table is stored int8 per row too (47 -> 12 MB; a gather, not a product, so no faster, only smaller).

For a plain BERT model (MiniLM) the graph takes one query per run and returns its unit vector
(evolve/int8_graph.py `QueryGraph`: Q, K and V as one product, no mask or shape bookkeeping; 129 nodes
instead of 275, ~0.25 ms less per query); other encoders get their own forward, quantised.

Only queries take this path. Stored vectors (skills, memory units) stay the fp32 model's, and a quantised
query vector is compared with them as the same space (`encoder_id` unchanged): its export is kept only
when its vectors agree with the fp32 pipeline's on PROBES (worst cosine >= PARITY_MIN, mean >=
PARITY_MEAN), so whichever query encoder a process ended up with, stored vectors stay valid. Recall of
int8 queries against fp32 documents: benchmarks/retrieval.py, benchmarks/memory_retrieval.py.

Built once per model folder into `<cache_dir>/onnx/` beside the fp32 graph (`make setup` does it), under
the same file lock; anything that fails raises `Int8Unavailable` and `SentenceEmbedder` keeps encoding
queries with the fp32 graph (logged once).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from evolve.onnx_encoder import PROBES, OnnxEncoder, OnnxUnavailable, artefact_paths, export_graph, file_lock

FORMAT = 2  # bump when the quantisation or the graph changes: older files are then ignored
ALPHA = 0.6
PARITY_MIN = 0.97  # worst cosine to the fp32 vector on PROBES + CHECKS (measured 0.988 on 600 varied texts)
PARITY_MEAN = 0.99  # mean cosine (measured 0.995)
CHECKS = [  # parity texts beside PROBES (none of int8_graph.CALIBRATION): short questions and stated facts
    "which shell does the team use?", "The user's favourite colour is green.", "why is the release blocked?",
    "Always run the formatter before committing.", "what did we decide about the cache eviction policy?",
    "lint config", "The backup job runs every night at 2am and keeps 14 days.",
]


class Int8Unavailable(RuntimeError):
    """The int8 query encoder cannot be built or loaded here (the reason is the message)."""


def int8_path(model_dir: Path, cache_dir: Path) -> Path:
    """The int8 graph of `model_dir` under `cache_dir` (beside the fp32 graph, whose sidecar it shares)."""
    onnx_path, _ = artefact_paths(model_dir, cache_dir)
    return onnx_path.with_name(f"{onnx_path.stem}-int8q{FORMAT}-a{ALPHA:g}.onnx")


def load_or_quantise(model_dir: Path, cache_dir: Path, load_torch: Any, fp32: OnnxEncoder) -> OnnxEncoder:
    """The int8 query encoder of `model_dir`, quantising the sentence-transformers model `load_torch()`
    first when the cache has none; checked against `fp32` (the fp32 graph's encoder) before it is kept."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_err  # present: the fp32 graph loaded

    path = int8_path(model_dir, cache_dir)
    _, meta_path = artefact_paths(model_dir, cache_dir)
    try:
        meta = json.loads(meta_path.read_text())
        if not path.is_file():
            with file_lock(path.with_suffix(".lock")):
                if not path.is_file():  # another process may have built it while we waited
                    _quantise_checked(load_torch(), meta, model_dir, path, fp32)
        return OnnxEncoder(path, meta, model_dir)
    except Int8Unavailable:
        raise
    # The export traces arbitrary model code, and ORT raises its own classes (not RuntimeError).
    except (OnnxUnavailable, OSError, RuntimeError, ValueError, KeyError, TypeError, ImportError,
            ort_err.Fail, ort_err.InvalidArgument, ort_err.InvalidGraph, ort_err.InvalidProtobuf) as e:
        raise Int8Unavailable(f"{type(e).__name__}: {e} (cache {path})") from e


def _quantise_checked(st: Any, meta: dict[str, Any], model_dir: Path, path: Path, fp32: OnnxEncoder) -> None:
    """Quantise, export to a temporary name, keep it only if its vectors agree with `fp32`'s."""
    from evolve.int8_graph import QueryGraph, export_query_graph, quantised_model  # torch: only when building

    tmp = path.with_name(f".{path.stem}.{os.getpid()}.onnx")
    try:
        try:
            export_query_graph(st, QueryGraph(st), tmp)
        except Int8Unavailable:  # not a plain BERT: the model's own forward, quantised
            export_graph(st, meta["inputs"], tmp, model=quantised_model(st))
        texts = [*PROBES, *CHECKS]
        cos = (OnnxEncoder(tmp, meta, model_dir).encode(texts) * fp32.encode(texts)).sum(axis=1)
        if float(cos.min()) < PARITY_MIN or float(cos.mean()) < PARITY_MEAN:
            raise Int8Unavailable(f"int8 graph drifts from fp32: cosine min {float(cos.min()):.4f}, "
                                  f"mean {float(cos.mean()):.4f}")
        os.replace(tmp, path)  # the commit point: readers look for the .onnx file
    finally:
        tmp.unlink(missing_ok=True)
