"""A Proxy replica's skill retrieval (embedding mode) and memory retrieval use one model and one query
encode: both read the last user message with all-MiniLM-L6-v2 by default, so the replica holds the model
once and the vector skills computed is the one memory searches with (serve/injection.py,
serve/memory_injection.py, evolve/embedding.py `shared_cache`). Real model, as the Proxy builds them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from core.config import MemoryConfig, SkillsConfig
from core.contracts import Skill
from evolve.bank import SkillBank
from evolve.embedding import shared_cache
from memory.store import Plan
from memory.units import Kind, Level, MemoryUnit
from serve.injection import SkillInjector
from serve.memory_injection import MemoryInjector

QUESTION = "Which date format should the delivery log use?"


def test_skills_and_memory_share_the_model_and_the_query_encode(tmp_path: Path, monkeypatch):
    skills_cfg = SkillsConfig(retrieval="embedding")
    SkillBank(tmp_path / "skills", skills_cfg).add_batch([Skill(
        name="iso-timestamps", category="general", description="Timestamps are ISO 8601 with the +08:00 offset.",
        body="Write every timestamp as YYYY-MM-DDTHH:MM:SS+08:00.")])
    skills = SkillInjector.build(skills_cfg, tmp_path / "skills")
    memory = MemoryInjector.build(MemoryConfig(min_similarity=0.0), tmp_path / "memory", tokenizer_path=None,
                                  max_model_len=4096)
    assert skills is not None and memory is not None
    cache = shared_cache()
    assert skills._search.retriever.cache is cache and memory.search.embedder is cache  # one model
    unit = MemoryUnit(kind=Kind.preference, content="The delivery log uses ISO 8601 timestamps.",
                      level=Level.user, user="alice")
    memory.search.store.apply(Plan(inserts=[(unit, cache.encode([unit.content])[0])]), [])

    encoded: list[str] = []
    real = cache.embedder.encode_query
    monkeypatch.setattr(cache.embedder, "encode_query", lambda text: encoded.append(text) or real(text))
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    names, _ = asyncio.run(skills.inject(body, anthropic=False))
    ids, _ = asyncio.run(memory.inject(body, False, "alice/w", "s1", "user", memory.mark(body, False)))
    assert names == ["iso-timestamps"] and ids == [unit.unit_id]  # both found what the query is about
    assert encoded == [QUESTION]  # ... with one encode
