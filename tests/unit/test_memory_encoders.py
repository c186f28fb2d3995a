"""Stored memory vectors record their encoder, on both backends (`state_cfg`): the writer re-encodes them
when the configured encoder changes, and a reader never compares its queries with another encoder's
vectors (a static encoder's space is not MiniLM's: evolve/static_encoder.py)."""

from __future__ import annotations

import numpy as np
import pytest

from core.config import MemoryConfig
from memory.extract import OfflineExtractor
from memory.index import LEGACY_ENCODER, VectorIndex, adopt_encoder
from memory.ingest import Ingestor
from memory.open import open_memory_store
from memory.retrieval import MemorySearch
from memory.store import Plan
from memory.units import Kind, Level, MemoryUnit, request_scopes
from tests.memory_fakes import WordEmbedder

OLD, NEW = WordEmbedder(64), WordEmbedder(48)  # two encoders: different ids (and here dims)


class Shifted(WordEmbedder):
    """The same dim as OLD but another space (every axis rolled by one): its queries against OLD's
    vectors would score unrelated units, the failure a dimension check cannot catch."""

    def __init__(self) -> None:
        super().__init__(64)
        self.encoder_id = "word-hash-64-shifted"

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.roll(super().encode(texts), 1, axis=1)


@pytest.fixture
def store(state_cfg, tmp_path):
    s = open_memory_store(tmp_path, state_cfg, storage_root=tmp_path)
    yield s
    s.close()


def unit(content: str) -> MemoryUnit:
    return MemoryUnit(kind=Kind.semantic, content=content, level=Level.workspace, user="alice", workspace="w")


def put(store, emb: WordEmbedder, *texts: str) -> list[MemoryUnit]:
    units = [unit(t) for t in texts]
    assert store.apply(Plan(inserts=[(u, emb.encode([u.content])[0]) for u in units]), [])
    return units


def test_a_store_without_a_record_holds_the_legacy_encoders_vectors(store):
    put(store, OLD, "the deploy target is kiwi")
    assert store.vector_encoder() is None
    legacy = WordEmbedder(64)
    legacy.encoder_id = LEGACY_ENCODER
    assert adopt_encoder(store, legacy.encoder_id, legacy.encode) == 0 and legacy.calls == []


def test_the_writer_re_encodes_every_vector_when_its_encoder_changes(store):
    kiwi, _ = put(store, OLD, "the deploy target is kiwi", "the editor is vim")
    assert adopt_encoder(store, OLD.encoder_id, OLD.encode) == 2  # unrecorded (legacy): re-encoded once
    assert store.vector_encoder() == OLD.encoder_id
    assert adopt_encoder(store, OLD.encoder_id, OLD.encode) == 0  # recorded: nothing to do
    reader = VectorIndex(store, NEW.dim, encoder_id=NEW.encoder_id)
    keys = [s.key for s in request_scopes("alice", "w", "s")]
    assert reader.search(keys, NEW.encode(["kiwi deploy"])[0], 5) == []  # OLD's vectors: not comparable
    assert adopt_encoder(store, NEW.encoder_id, NEW.encode) == 2
    assert store.vector_encoder() == NEW.encoder_id
    assert reader.search(keys, NEW.encode(["kiwi deploy"])[0], 5)[0][0] == kiwi.unit_id  # reloaded whole


def test_a_reader_never_scores_queries_against_another_encoders_vectors(store):
    put(store, OLD, "the deploy target is kiwi", "the editor is vim", "tabs over spaces")
    adopt_encoder(store, OLD.encoder_id, OLD.encode)
    keys = [s.key for s in request_scopes("alice", "w", "s")]
    other = Shifted()
    assert VectorIndex(store, 64, encoder_id=other.encoder_id).search(keys, other.encode(["kiwi"])[0], 5) == []
    assert VectorIndex(store, 64, encoder_id=OLD.encoder_id).search(keys, OLD.encode(["kiwi"])[0], 5)
    search = MemorySearch(store, MemoryConfig(min_similarity=-1.0), other)
    try:  # full text still answers
        res = search.search("kiwi", request_scopes("alice", "w", "s"))
    finally:
        search.close()
    assert res.vector == 0 and [u.content for u, _ in res.hits] == ["the deploy target is kiwi"]


def test_the_memory_writer_adopts_its_encoder_at_start(store):
    put(store, OLD, "the deploy target is kiwi")
    new = WordEmbedder(48)
    Ingestor(store, MemoryConfig(), OfflineExtractor(), new)
    assert store.vector_encoder() == new.encoder_id and new.calls == [["the deploy target is kiwi"]]
