"""Retrieval quality of a query encoder on a labelled set of skill queries (benchmarks/data/skill_queries.json).

The set: 48 skills as an agent's library holds them and 96 user requests, each labelled with the skill(s)
it should retrieve; the requests mostly paraphrase the descriptions rather than repeat their words.
Skills are encoded as the retriever encodes them (`evolve.embedding.skill_text`), ranked by cosine.
recall@k = per query, the share of its relevant skills (at most k) among the k best, averaged.
Used by benchmarks/retrieval.py (one row per encoder) and tests/unit/test_evolve_encoders.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from core.contracts import Skill
from evolve.embedding import Embedder, query_vector, skill_text

DATA = Path(__file__).resolve().parent / "data" / "skill_queries.json"


def labelled_set(path: Path = DATA) -> tuple[list[Skill], list[str], list[set[str]]]:
    """(skills, queries, relevant skill names per query)."""
    data = json.loads(path.read_text())
    skills = [Skill(**s) for s in data["skills"]]
    names = {s.name for s in skills}
    relevant = [set(q["relevant"]) for q in data["queries"]]
    if unknown := set().union(*relevant) - names:
        raise ValueError(f"{path}: queries label unknown skills {sorted(unknown)}")
    return skills, [q["q"] for q in data["queries"]], relevant


def recall_at_k(sims: np.ndarray, names: list[str], relevant: list[set[str]], k: int) -> float:
    """(Q, N) query-skill similarities -> mean over queries of |relevant in top k| / min(k, |relevant|)."""
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return float(np.mean([len(rel & {names[j] for j in row}) / min(k, len(rel))
                          for row, rel in zip(top, relevant, strict=True)]))


def encoder_recall(embedder: Embedder, ks: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """recall@k of `embedder` on the labelled set, as retrieval uses it: skills encoded as documents
    (`encode`), each query on its own through the query path (`query_vector`: the int8 graph when the
    embedder has one)."""
    skills, queries, relevant = labelled_set()
    qvecs = np.stack([query_vector(embedder, q) for q in queries])
    sims = qvecs @ embedder.encode([skill_text(s) for s in skills]).T
    names = [s.name for s in skills]
    return {f"recall_at_{k}": round(recall_at_k(sims, names, relevant, k), 3) for k in ks} | {
        "queries": len(queries), "skills": len(skills)}
