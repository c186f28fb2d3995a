"""Retrieval: pure scoring invariants, both modes return relevant skills, SkillSearch follows the bank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.config import SkillsConfig
from core.contracts import Skill
from evolve.bank import SkillBank
from evolve.embedding import EmbeddingCache, SentenceEmbedder
from evolve.retrieval import (
    EmbeddingRetriever,
    SkillSearch,
    TemplateRetriever,
    make_retriever,
    overlap_scores,
    render_skills_block,
    top_k_indices,
)

LIBRARY = [
    Skill(name="backup-before-modifying", category="file_operations",
          description="Create a .bak copy of a file before modifying or overwriting it.",
          body="# Backup before modifying\n- `cp config.json config.json.bak` first, then edit."),
    Skill(name="iso-8601-timestamps", category="data_analysis",
          description="Timestamps must be ISO 8601 with the +08:00 offset.",
          body="Write `2024-05-01T09:30:00+08:00`, never `2024-05-01 09:30`."),
    Skill(name="git-commit-messages", category="coding",
          description="Write imperative, focused git commit messages.", body="One change per commit."),
    Skill(name="polite-email-replies", category="communication",
          description="Draft email replies that are short and polite.", body="Greet, answer, sign off."),
    Skill(name="clarify-ambiguous-requests", category="general",
          description="Ask one clarifying question when a request is ambiguous.", body="Ask before acting."),
    Skill(name="verify-before-reporting", category="general",
          description="Check the result of an action before reporting success.", body="Re-read the file."),
]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()  # the real all-MiniLM-L6-v2 from the offline package


def test_top_k_indices_matches_a_full_sort():
    rng = np.random.default_rng(0)
    for _ in range(50):
        scores = rng.integers(0, 5, size=200).astype(np.float32)  # many ties
        cands = np.sort(rng.choice(200, size=rng.integers(0, 200), replace=False))
        k = int(rng.integers(0, 12))
        expect = sorted(cands.tolist(), key=lambda i: (-scores[i], i))[:k]
        assert top_k_indices(scores, cands, k).tolist() == expect


def test_overlap_scores_counts_distinct_query_tokens():
    rows = [[0, 1, 2], [1], [], [2, 3]]  # skill -> token ids
    ids = np.array([t for r in rows for t in r])
    who = np.array([i for i, r in enumerate(rows) for _ in r])
    order = np.argsort(ids, kind="stable")
    got = overlap_scores(ids[order], who[order], np.array([1, 2]), 4)
    assert got.tolist() == [2, 1, 0, 1]


def test_template_mode_returns_the_backup_skill_for_modify_config_json():
    r = TemplateRetriever()
    r.build(LIBRARY)
    names = [s.name for s in r.retrieve("Please modify config.json to set debug=true", 6, 3)]
    assert "backup-before-modifying" in names
    assert "iso-8601-timestamps" not in names and "polite-email-replies" not in names
    assert {"clarify-ambiguous-requests", "verify-before-reporting"} <= set(names)  # general skills
    ts = [s.name for s in r.retrieve("log the meeting with timestamps", 0, 3)]
    assert ts == ["iso-8601-timestamps"]


def test_template_general_skills_rank_by_overlap_and_respect_top_k():
    r = TemplateRetriever()
    r.build(LIBRARY)
    got = r.retrieve("check the result before reporting", 1, 0)
    assert [s.name for s in got] == ["verify-before-reporting"]


def test_embedding_mode_returns_the_backup_skill_for_modify_config_json(embedder):
    r = EmbeddingRetriever(EmbeddingCache(embedder))
    r.build(LIBRARY)
    got = r.retrieve("modify config.json", 2, 1)
    assert [s.name for s in got][-1] == "backup-before-modifying"  # the one task-specific pick
    got = r.retrieve("what time format should the log use?", 0, 1)
    assert [s.name for s in got] == ["iso-8601-timestamps"]


def test_embeddings_are_computed_once_per_skill(embedder):
    calls: list[int] = []

    class Counting:
        dim = embedder.dim

        def encode(self, texts):
            calls.append(len(texts))
            return embedder.encode(texts)

    r = EmbeddingRetriever(EmbeddingCache(Counting()))
    r.build(LIBRARY)
    r.build(LIBRARY + [Skill(name="new-skill", description="something new entirely")])
    r.retrieve("query", 1, 1)
    assert calls == [len(LIBRARY), 1, 1]  # all, then only the new skill, then only the query


def test_make_retriever_lists_valid_modes():
    with pytest.raises(ValueError, match="valid: embedding, template"):
        make_retriever("bm25")
    with pytest.raises(ValueError, match="needs an embedder"):
        make_retriever("embedding")


def test_render_skills_block():
    assert render_skills_block([]) == ""
    block = render_skills_block(LIBRARY[:2])
    assert block.startswith("## Active Skills")
    assert "### backup-before-modifying" in block and "cp config.json" in block
    assert block.index("backup-before") < block.index("iso-8601")


def test_skill_search_follows_the_bank_without_restart(tmp_path: Path):
    now = [0.0]
    cfg = SkillsConfig(retrieval="template", refresh_s=1.0)
    writer = SkillBank(tmp_path, cfg)
    search = SkillSearch(SkillBank(tmp_path, cfg), cfg, clock=lambda: now[0])
    assert search.retrieve("modify config.json") == [] and search.generation == 0
    writer.add_batch(LIBRARY[:1])
    assert search.refresh() is False  # refresh_s not yet passed: no disk access at all
    now[0] = 1.5
    assert search.refresh() is True and search.generation == 1
    assert [s.name for s in search.retrieve("modify config.json")] == ["backup-before-modifying"]
    now[0] = 3.0
    assert search.refresh() is False  # nothing changed: no rebuild


def test_skill_search_disabled_returns_nothing(tmp_path: Path):
    cfg = SkillsConfig(enabled=False)
    bank = SkillBank(tmp_path, cfg)
    bank.add_batch(LIBRARY)
    assert SkillSearch(bank, cfg).retrieve("modify config.json") == []


def test_a_lessons_rule_is_rendered_once():
    """A feedback lesson's description is its rule and its body states it again: the block says it once
    (it is injected into every matching turn); a description the body does not hold is kept."""
    lesson = Skill(name="status-lowercase", description="Status updates must be written in lowercase only.",
                   category="general", body="- **Rule:** Status updates must be written in lowercase only.\n"
                                            "- **Seen in the task:** \"Post a short note.\"")
    block = render_skills_block([lesson, LIBRARY[0]])
    assert block.count("Status updates must be written in lowercase only.") == 1
    assert "### status-lowercase\n\n- **Rule:**" in block
    assert f"_{LIBRARY[0].description.strip()}_" in block


class _RowEmbedder:
    """Skill text ("skill N. ...") -> row N of a seeded matrix of unit rows: the index math under test,
    without a 6,000-skill model encode."""

    def __init__(self, rows: np.ndarray):
        self.rows, self.dim = rows, rows.shape[1]

    def encode(self, texts):
        return np.stack([self.rows[int(t.split(".")[0].split()[1])] for t in texts])


def _clustered(n: int, d: int, centres: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d)).astype(np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    x = c[rng.integers(0, centres, n)] + 0.05 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True), c


def test_a_large_library_is_prefiltered_by_sign_bits_and_finds_the_exact_top_k():
    from evolve.retrieval import PREFILTER_MIN

    n = PREFILTER_MIN + 2000
    # 300 topics of ~20 skills each; a query about a topic has cosine ~0.5 to its skills and ~0 +- 0.05 to the
    # rest, as MiniLM's relevant and unrelated skills do (see benchmarks/skill_recall.py)
    rows, centres = _clustered(n, 384, 300, seed=5)
    skills = [Skill(name=f"skill-{i}", category="general" if i % 3 == 0 else "coding", description=f"d{i}")
              for i in range(n)]
    cache = EmbeddingCache(_RowEmbedder(rows))
    pre, exact = EmbeddingRetriever(cache), EmbeddingRetriever(cache, prefilter_min=n + 1)
    pre_index, exact_index = pre.build(skills), exact.build(skills)
    assert pre_index.codes_t is not None and exact_index.codes_t is None
    rng = np.random.default_rng(9)
    same = 0
    for q in range(200):
        v = centres[q % len(centres)] + 0.05 * rng.standard_normal(384).astype(np.float32)
        v /= np.linalg.norm(v)
        got, want = pre.retrieve_vector(v, 3, 5), exact.retrieve_vector(v, 3, 5)
        assert len(got) == 8 and sum(s.category == "general" for s in got) == 3
        same += [s.name for s in got] == [s.name for s in want]
    assert same >= 196, same  # the whole ranked top 8 equals the exact scan's in >= 98% of queries


def test_a_small_library_is_scanned_exactly(embedder):
    r = EmbeddingRetriever(EmbeddingCache(embedder))
    assert r.build(LIBRARY).codes_t is None
    forced = EmbeddingRetriever(EmbeddingCache(embedder), prefilter_min=1)  # every row is a candidate
    assert forced.build(LIBRARY).codes_t is not None
    for q in ("modify config.json", "what time format should the log use?", "reply to this email"):
        assert forced.retrieve(q, 2, 2) == r.retrieve(q, 2, 2)
