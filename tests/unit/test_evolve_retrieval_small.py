"""Template retrieval on a small library (evolve/retrieval.py `SMALL_LIBRARY`) ranks in plain Python; it must
pick exactly what the numpy path picks, ties included (by score, then library order)."""

from __future__ import annotations

import random

import pytest

from core.contracts import Skill
from evolve import retrieval
from evolve.retrieval import TemplateRetriever

WORDS = ("calendar meeting schedule email draft reply deploy server error test code bug fix plan budget invoice "
         "report summary agent script cron sql query table docs review").split()
CATEGORIES = ("general", "common_mistakes", "coding", "communication", "automation", "scheduling", "data_analysis")


def _library(rng: random.Random, n: int) -> list[Skill]:
    return [Skill(name=f"skill-{i:03d}", description=" ".join(rng.choices(WORDS, k=rng.randint(2, 6))),
                  category=rng.choice(CATEGORIES), body=" ".join(rng.choices(WORDS, k=rng.randint(3, 30))))
            for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_the_python_path_picks_what_numpy_picks(seed, monkeypatch):
    rng = random.Random(seed)
    skills = _library(rng, rng.choice((1, 5, 36, 120, 256)))
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(0, 12))) for _ in range(40)] + ["", "nothing matches zzz"]
    small = TemplateRetriever()
    assert small.build(skills)[3] is not None  # the Python path is the one under test
    monkeypatch.setattr(retrieval, "SMALL_LIBRARY", 0)
    big = TemplateRetriever()
    assert big.build(skills)[3] is None
    for q in queries:
        for k, tk in ((6, 3), (0, 2), (3, 0), (500, 500)):
            want = [s.name for s in big.retrieve(q, k, tk)]
            assert [s.name for s in small.retrieve(q, k, tk)] == want, (q, k, tk)


def test_ties_go_to_the_earlier_skill():
    same = [Skill(name=f"s{i}", description="calendar meeting", category="general", body="plan the calendar")
            for i in range(8)]
    r = TemplateRetriever()
    r.build(same)
    assert [s.name for s in r.retrieve("calendar meeting", 3, 0)] == ["s0", "s1", "s2"]
