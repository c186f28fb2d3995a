"""Query encoders: the choice between the transformer and its static distillation, their vector spaces
(`encoder_id`), the distillation cache, the query-vector cache, and retrieval quality on the labelled
skill queries (benchmarks/data/skill_queries.json) against thresholds the encoders meet today."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from benchmarks.skill_recall import encoder_recall, labelled_set, recall_at_k
from core.config import MemoryConfig, SkillsConfig
from evolve import embedding, static_encoder
from evolve.embedding import DEFAULT_MODEL, EmbeddingCache, SentenceEmbedder, resolve_model_path
from evolve.static_encoder import StaticUnavailable, load_or_distill, model_dir_of

pytestmark = pytest.mark.skipif(importlib.util.find_spec("model2vec") is None, reason="needs model2vec")

MODEL_DIR = resolve_model_path(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def static() -> SentenceEmbedder:
    """The static encoder from the default cache (`make setup` distils it; else this distils it, minutes)."""
    return SentenceEmbedder(encoder="static")


@pytest.fixture(scope="module")
def minilm() -> SentenceEmbedder:
    return SentenceEmbedder()  # onnxruntime when available, else torch: the same vectors


def test_the_encoder_is_a_validated_choice_and_names_its_vector_space(static, minilm):
    assert SkillsConfig().embedding_encoder == MemoryConfig().embedding_encoder == "transformer"
    assert SkillsConfig(embedding_encoder="static").embedding_encoder == "static"
    with pytest.raises(ValidationError):
        MemoryConfig(embedding_encoder="word2vec")
    with pytest.raises(ValueError, match="encoder"):
        SentenceEmbedder(encoder="word2vec")
    assert minilm.encoder_id == DEFAULT_MODEL and static.backend == "static"
    assert static.encoder_id.startswith(f"{DEFAULT_MODEL}+static{static_encoder.PCA_DIMS}-")
    assert static.dim == static_encoder.PCA_DIMS != minilm.dim


def test_static_vectors_are_unit_rows_and_deterministic(static):
    texts = ["which editor do I use?", "", "Ünïcödé ✓ 日本語", " ".join(["long text"] * 400), "hi"]
    a, b = static.encode(texts), static.encode(texts[::-1])[::-1]
    norms = np.linalg.norm(a, axis=1)
    assert a.dtype == np.float32 and a.shape == (5, static.dim)
    assert np.allclose(norms[norms > 0], 1.0, atol=1e-5) and np.allclose(a, b, atol=1e-6)
    assert float(a[0] @ static.encode(["what text editor do I use"])[0]) > float(a[0] @ a[4])


def test_distillation_runs_once_per_cache_and_its_id_fingerprints_the_table(static, tmp_path, monkeypatch):
    built = model_dir_of(MODEL_DIR, embedding.default_cache_dir())
    runs = []

    def fake_distill(model_dir: Path, path: Path) -> None:  # the real one takes minutes: copy its output
        runs.append(path)
        shutil.copytree(built, path)

    monkeypatch.setattr(static_encoder, "distill_into", fake_distill)
    first = load_or_distill(MODEL_DIR, tmp_path, DEFAULT_MODEL)
    again = load_or_distill(MODEL_DIR, tmp_path, DEFAULT_MODEL)
    assert len(runs) == 1 and first.encoder_id == again.encoder_id == static.encoder_id
    table = runs[0] / "model.safetensors"
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(table))
    name = next(iter(tensors))
    tensors[name] = tensors[name].copy()
    tensors[name][0] *= -1  # another machine's distillation may differ: another id, never mixed
    save_file(tensors, str(table))
    assert load_or_distill(MODEL_DIR, tmp_path, DEFAULT_MODEL).encoder_id != static.encoder_id


def test_static_is_refused_clearly_without_model2vec(monkeypatch, tmp_path):
    monkeypatch.setattr(static_encoder.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(StaticUnavailable, match="model2vec"):
        SentenceEmbedder(encoder="static", cache_dir=tmp_path)


def test_a_repeated_query_is_encoded_once_and_the_cache_is_bounded(monkeypatch):
    class Counting:
        dim, encoder_id = 3, "counting"

        def __init__(self) -> None:
            self.calls = 0

        def encode(self, texts: list[str]) -> np.ndarray:
            self.calls += 1
            return np.tile(np.eye(3, dtype=np.float32)[0], (len(texts), 1))

    monkeypatch.setattr(embedding, "QUERY_CACHE", 2)
    emb = Counting()
    cache = EmbeddingCache(emb)
    for q in ["a", "a", "b", "a", "c", "b"]:  # "b" was evicted by "c" ("a" was used more recently)
        cache.encode_query(q)
    assert emb.calls == 4


def test_recall_at_k_counts_relevant_skills_among_the_best_k():
    sims = np.array([[0.9, 0.8, 0.1], [0.1, 0.2, 0.3]])
    names = ["a", "b", "c"]
    assert recall_at_k(sims, names, [{"b"}, {"c"}], 1) == 0.5
    assert recall_at_k(sims, names, [{"a", "b"}, {"a"}], 2) == 0.5  # 2/2 and 0/1


def test_the_labelled_set_is_consistent():
    skills, queries, relevant = labelled_set()
    assert len(skills) >= 40 and len(queries) >= 80 and all(relevant)
    assert len({s.name for s in skills}) == len(skills)


def test_minilm_retrieves_the_labelled_skills(minilm):
    """MiniLM measured 0.635 / 0.901; a regression in the encoder, skill_text or the set fails here."""
    r = encoder_recall(minilm)
    assert r["recall_at_1"] >= 0.58 and r["recall_at_5"] >= 0.85


def test_static_retrieves_the_labelled_skills_above_its_floor(static):
    """The static encoder measured 0.469 / 0.708: the floor of the documented trade-off (README "Benchmarks")."""
    r = encoder_recall(static)
    assert r["recall_at_1"] >= 0.40 and r["recall_at_5"] >= 0.65
