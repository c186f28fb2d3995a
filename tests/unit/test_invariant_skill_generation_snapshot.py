"""Issue 12 item 8: the generation recorded on a turn is the generation of the skills it was served with.

A refresh that lands between "retrieve the skills" and "read the generation" (another request's refresh
in template mode; the refresh running in a worker thread in embedding mode) must not pair the old
library's skills with the new library's generation, nor the new skills with the old generation. The
interleavings are driven by hooks and events, not by timing.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import numpy as np

from core.config import SkillsConfig
from core.contracts import Skill
from evolve.bank import SkillBank
from evolve.embedding import EmbeddingCache
from evolve.retrieval import SkillSearch
from serve.injection import SkillInjector

OLD = Skill(name="verify-before-reporting", category="general",
            description="Check the result of an action before reporting success.", body="Re-read the file.")
NEW = Skill(name="clarify-ambiguous-requests", category="general",
            description="Ask one clarifying question when a request is ambiguous.", body="Ask before acting.")


def _body() -> dict:
    return {"messages": [{"role": "user", "content": "please check the file and report"}]}


class HashEmbedder:
    """Deterministic unit vectors from a text hash: embedding mode without a model."""

    dim = 16

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)


def _library(tmp_path: Path, cfg: SkillsConfig) -> SkillBank:
    writer = SkillBank(tmp_path, cfg)
    writer.add_batch([OLD])  # generation 1
    return writer


def test_template_mode_a_refresh_between_retrieve_and_generation_read_keeps_the_pair(tmp_path: Path):
    cfg = SkillsConfig(retrieval="template", refresh_s=3600.0)
    writer = _library(tmp_path, cfg)
    search = SkillSearch(SkillBank(tmp_path, cfg), cfg)
    injector = SkillInjector(search, cfg)
    assert search.generation == 1
    original = search.retriever.retrieve

    def retrieve_then_another_request_refreshes(*args, **kwargs):
        picked = original(*args, **kwargs)
        writer.add_batch([NEW])  # generation 2 lands ...
        assert search.refresh(force=True)  # ... and another request's refresh picks it up right now
        return picked

    search.retriever.retrieve = retrieve_then_another_request_refreshes
    body = _body()
    names, generation = asyncio.run(injector.inject(body, anthropic=False))
    assert names == [OLD.name]
    assert generation == 1, "skills of generation 1 were recorded as served under generation 2"
    search.retriever.retrieve = original
    names, generation = asyncio.run(injector.inject(_body(), anthropic=False))
    assert sorted(names) == sorted([OLD.name, NEW.name]) and generation == 2


def test_embedding_mode_a_refresh_in_a_thread_never_splits_skills_from_their_generation(tmp_path: Path):
    cfg = SkillsConfig(retrieval="embedding", refresh_s=3600.0)
    writer = _library(tmp_path, cfg)
    search = SkillSearch(SkillBank(tmp_path, cfg), cfg, EmbeddingCache(HashEmbedder()), clock=lambda: 0.0)
    injector = SkillInjector(search, cfg)
    built, go = threading.Event(), threading.Event()
    original_build = search.retriever.build

    def build_then_pause(skills):
        out = original_build(skills)
        built.set()  # the new index exists; the refresh has not finished yet
        assert go.wait(10)
        return out

    search.retriever.build = build_then_pause
    writer.add_batch([NEW])
    refresher = threading.Thread(target=search.refresh, kwargs={"force": True})
    refresher.start()
    try:
        assert built.wait(10)
        names, generation = asyncio.run(injector.inject(_body(), anthropic=False))
    finally:
        go.set()
        refresher.join(10)
    served = {1: [OLD.name], 2: sorted([OLD.name, NEW.name])}
    assert sorted(names) == served[generation], (names, generation)
    names, generation = asyncio.run(injector.inject(_body(), anthropic=False))
    assert generation == 2 and sorted(names) == served[2]
