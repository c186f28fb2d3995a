"""Fusion and budgeting: reciprocal-rank fusion with recency/kind/confidence, and the shared token budget."""

from __future__ import annotations

import pytest

from memory.budget import HEADER, EstimatedCounter, TokenizerCounter, fit, line, memory_budget, render
from memory.fusion import DAY_S, FusionWeights, fuse, recency, rrf
from memory.units import Kind, Level, MemoryUnit

NOW = 1.8e9


def unit(uid: str, kind: Kind = Kind.semantic, age_days: float = 0.0, conf: float = 1.0, content: str = "x y") -> MemoryUnit:
    return MemoryUnit(unit_id=uid, kind=kind, content=content, level=Level.user, user="u",
                      updated_at=NOW - age_days * DAY_S, confidence=conf)


def test_rrf_rewards_agreement_between_legs():
    s = rrf([["a", "b", "c"], ["b", "d"]], k=60)
    assert s["b"] == pytest.approx(1 / 62 + 1 / 61) and max(s, key=s.get) == "b"
    assert s["a"] == pytest.approx(1 / 61) and s["a"] > s["c"] > 0 and s["d"] == pytest.approx(1 / 62)


def test_recency_halves_the_decaying_share_per_half_life():
    assert recency(0, 30, 0.3) == pytest.approx(1.0)
    assert recency(30 * DAY_S, 30, 0.3) == pytest.approx(0.85)
    assert recency(1e12, 30, 0.3) == pytest.approx(0.7)
    assert recency(-5.0, 30, 0.3) == pytest.approx(1.0)  # clock skew


def test_fuse_weighs_kind_recency_and_confidence_and_drops_unfetched_ids():
    units = {u.unit_id: u for u in (unit("old", age_days=300), unit("new"), unit("ep", Kind.episodic),
                                    unit("unsure", conf=0.0))}
    w = FusionWeights(60, 30, 0.3, {"episodic": 0.5})
    # same rank in one leg each: only the weights differ
    got = fuse([["old", "gone"], ["new"], ["ep"], ["unsure"]], units, NOW, w)
    order = [u.unit_id for u, _ in got]
    assert order == ["new", "old", "ep", "unsure"] and "gone" not in order
    scores = dict((u.unit_id, s) for u, s in got)
    assert scores["ep"] == pytest.approx(scores["new"] * 0.5) and scores["unsure"] == pytest.approx(scores["new"] * 0.5)


def test_fuse_breaks_ties_by_unit_id():
    units = {u.unit_id: u for u in (unit("b"), unit("a"))}
    assert [u.unit_id for u, _ in fuse([["b"], ["a"]], units, NOW, FusionWeights())] == ["a", "b"]


class Words:
    """One token per whitespace-separated word (and newline), so budgets are easy to reason about."""

    def count(self, text: str) -> int:
        return len(text.replace("\n", " \n ").split(" ")) if text else 0


def test_memory_gets_what_skills_left_and_never_more_than_the_context_room():
    assert memory_budget(512, 100, 10_000) == 412
    assert memory_budget(512, 600, 10_000) == 0
    assert memory_budget(512, 0, 50) == 50
    assert memory_budget(512, 0, -20) == 0


def test_fit_never_exceeds_the_budget_and_skips_to_smaller_units():
    c = Words()
    big = unit("big", content="word " * 60)
    small = [unit(f"s{i}", content="a short fact") for i in range(3)]
    header = c.count(HEADER) + 1
    budget = header + 3 * (c.count(line(small[0])) + 1)
    chosen, tokens = fit([big, *small], budget, c)
    assert [u.unit_id for u in chosen] == ["s0", "s1", "s2"]
    assert tokens == c.count(render(chosen)) <= budget
    for b in range(0, budget + 5):
        chosen, tokens = fit([big, *small], b, c)
        assert tokens <= b and tokens == (c.count(render(chosen)) if chosen else 0)


def test_fit_with_no_room_for_the_header_injects_nothing():
    assert fit([unit("a")], 3, Words()) == ([], 0)


def test_the_estimate_over_counts_a_large_vocabulary_tokenizer():
    """The estimate stands in for the tokenizer of an upstream model: it must not under-count."""
    from pathlib import Path

    from evolve.embedding import resolve_model_path

    ref = TokenizerCounter(resolve_model_path("all-MiniLM-L6-v2"))  # WordPiece, 30k vocabulary
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()[:4000]
    for text in (readme, "Café naïve résumé — déjà vu", "東京の天気は晴れです。明日は雨かもしれません。",
                 render([unit("a", content="The user's editor is vim; deploy target eu-west-1 (v2.3.1).")])):
        assert EstimatedCounter().count(text) >= ref.count(text), text[:40]
