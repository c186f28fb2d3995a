"""The ONNX query encoder: the same vectors as sentence-transformers on torch, exported once, torch fallback."""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from evolve import embedding, onnx_encoder
from evolve.embedding import SentenceEmbedder, resolve_model_path
from evolve.onnx_encoder import (
    OnnxUnavailable,
    artefact_paths,
    cache_key,
    load_or_export,
    mean_pool_normalise,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs onnxruntime")

MODEL_DIR = resolve_model_path("all-MiniLM-L6-v2")


def varied_texts(n: int = 300, seed: int = 0) -> list[str]:
    """Short queries, facts, code, unicode, whitespace oddities and texts past the 256-token limit."""
    rng = np.random.default_rng(seed)
    words = ("which editor do we use deploy the staging server migration blocked prefers tabs over spaces "
             "timezone Europe/Paris kalomi vorutan brisa 42 3.14 v1.2.3 user's naïve café 日本語 ✓ 🎉 "
             "def f(x): return x**2 SELECT * FROM t; https://example.com/a?b=c --flag=value "
             "ÉTÉ STRASSE straße Ωmega ünïcödé").split()
    fixed = ["", " ", "hi", "  leading and trailing  ", "tabs\tand\nnewlines", "!!!???...", "a" * 600,
             " ".join(["a long text past the sequence limit of the model"] * 50)]
    out = list(fixed)
    while len(out) < n:
        # mostly query and fact lengths; a few long ones (each costs ~50x a short one to encode)
        k = int(rng.choice([1, 2, 4, 8, 20, 300], p=[0.2, 0.2, 0.2, 0.2, 0.17, 0.03]))
        out.append(" ".join(str(w) for w in rng.choice(words, size=k)))
    return out


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def torch_embedder() -> SentenceEmbedder:
    return SentenceEmbedder(backend="torch")


@pytest.fixture(scope="module")
def onnx_embedder(cache_dir: Path) -> SentenceEmbedder:
    return SentenceEmbedder(backend="onnx", cache_dir=cache_dir)  # exports into the module's cache once


def test_onnx_vectors_equal_torch_vectors_batched_and_one_at_a_time(torch_embedder, onnx_embedder):
    texts = varied_texts()
    want = torch_embedder.encode(texts)
    got = onnx_embedder.encode(texts)
    assert got.shape == want.shape == (len(texts), 384) and got.dtype == np.float32
    assert float((got * want).sum(axis=1).min()) >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    singles = np.stack([onnx_embedder.encode([t])[0] for t in texts[:60]])  # the query path: one text, no padding
    assert float((singles * want[:60]).sum(axis=1).min()) >= 0.9999


def test_onnx_tokenisation_equals_the_sentence_transformers_tokenizer(torch_embedder, onnx_embedder):
    texts = varied_texts(n=120, seed=1)
    want = torch_embedder._torch().preprocess(texts)["input_ids"].tolist()
    assert onnx_embedder._onnx.token_ids(texts) == want


def test_mean_pool_normalise_equals_the_torch_pooling_and_normalize_modules(torch_embedder):
    import torch

    st = torch_embedder._torch()
    rng = np.random.default_rng(2)
    hidden = rng.standard_normal((5, 7, 384)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 3 + [0] * 4, [1] + [0] * 6, [1] * 5 + [0] * 2, [0] * 7], dtype=np.int64)
    feats = {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)}
    want = st[2](st[1](feats))["sentence_embedding"].numpy()
    assert np.allclose(mean_pool_normalise(hidden, mask), want, atol=1e-6)


def test_an_export_is_reused_without_loading_torch(cache_dir, onnx_embedder, monkeypatch):
    def refused(*_a):
        raise AssertionError("exported again or loaded torch although the cache holds the graph")

    monkeypatch.setattr(onnx_encoder, "_export_checked", refused)
    monkeypatch.setattr(SentenceEmbedder, "_torch", refused)
    again = SentenceEmbedder(backend="auto", cache_dir=cache_dir)
    assert again.backend == "onnx"
    assert np.array_equal(again.encode(["same vectors"]), onnx_embedder.encode(["same vectors"]))


def test_a_process_that_waited_for_the_export_lock_uses_the_finished_export(cache_dir, onnx_embedder, tmp_path,
                                                                            monkeypatch):
    src_onnx, src_meta = artefact_paths(MODEL_DIR, cache_dir)
    onnx_path, meta_path = artefact_paths(MODEL_DIR, tmp_path)
    onnx_path.parent.mkdir(parents=True)
    exports: list[str] = []
    monkeypatch.setattr(onnx_encoder, "_export_checked", lambda *a: exports.append("again"))
    at_lock = threading.Event()
    real_lock = onnx_encoder.file_lock

    def lock_seen(path):
        at_lock.set()  # the waiter has already found no graph in the cache
        return real_lock(path)

    monkeypatch.setattr(onnx_encoder, "file_lock", lock_seen)
    got: list[object] = []
    with real_lock(onnx_path.with_suffix(".lock")):  # "another process" holds the lock while exporting
        waiter = threading.Thread(target=lambda: got.append(load_or_export(MODEL_DIR, tmp_path, lambda: None)))
        waiter.start()
        assert at_lock.wait(60)
        meta_path.write_text(src_meta.read_text())
        onnx_path.write_bytes(src_onnx.read_bytes())
    waiter.join(120)
    assert exports == [] and len(got) == 1 and got[0].dim == 384


def test_an_export_that_drifts_from_torch_is_refused_and_not_cached(torch_embedder, tmp_path, monkeypatch):
    def cls_pooling(hidden, mask):  # a wrong pipeline: the first token instead of the mean
        v = hidden[:, 0]
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    monkeypatch.setattr(onnx_encoder, "mean_pool_normalise", cls_pooling)
    with pytest.raises(OnnxUnavailable, match="drifts"):
        load_or_export(MODEL_DIR, tmp_path, torch_embedder._torch)
    onnx_path, meta_path = artefact_paths(MODEL_DIR, tmp_path)
    assert not onnx_path.exists() and not [p for p in onnx_path.parent.iterdir() if p.suffix == ".onnx"]


def test_without_onnxruntime_the_embedder_falls_back_to_torch_and_warns_once(tmp_path, monkeypatch, caplog):
    real = importlib.util.find_spec
    monkeypatch.setattr(onnx_encoder.importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    monkeypatch.setattr(embedding, "_fallback_logged", False)
    with caplog.at_level(logging.DEBUG, logger="evolve.embedding"):
        first = SentenceEmbedder(cache_dir=tmp_path)
        second = SentenceEmbedder(cache_dir=tmp_path)
    assert first.backend == second.backend == "torch" and first.dim == 384
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "onnxruntime is not installed" in warnings[0].getMessage()
    with pytest.raises(OnnxUnavailable):
        SentenceEmbedder(backend="onnx", cache_dir=tmp_path)


def test_a_corrupt_cached_export_is_reported_not_crashing(tmp_path):
    onnx_path, meta_path = artefact_paths(MODEL_DIR, tmp_path)
    onnx_path.parent.mkdir(parents=True)
    meta_path.write_text(json.dumps({"inputs": ["input_ids"], "max_seq_length": 256, "dim": 384, "pad_id": 0,
                                     "pad_token": "[PAD]"}))
    onnx_path.write_bytes(b"not a protobuf")
    with pytest.raises(OnnxUnavailable, match="cache"):
        load_or_export(MODEL_DIR, tmp_path, lambda: None)


def test_the_cache_key_follows_the_model_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    before = cache_key(tmp_path)
    assert cache_key(tmp_path) == before
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert cache_key(tmp_path) != before


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        SentenceEmbedder(backend="tensorrt")
