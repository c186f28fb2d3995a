"""Rank fusion of the retrieval legs (pure): reciprocal-rank fusion, then recency, kind and confidence.

    score(u) = sum over legs of 1 / (rrf_k + rank_leg(u))          (rank from 1; absent: no term)
               * kind_weight[kind(u)]
               * ((1 - recency_weight) + recency_weight * 0.5 ** (age_days(u) / half_life_days))
               * (0.5 + 0.5 * confidence(u))

Rank fusion needs no calibration between BM25 scores and cosines (Cormack et al., 2009); a unit found by
both legs outranks one found by one. Age is measured from `updated_at`: a fact confirmed again is fresh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memory.units import MemoryUnit

DAY_S = 86400.0


@dataclass(frozen=True)
class FusionWeights:
    rrf_k: float = 60.0
    recency_half_life_days: float = 30.0
    recency_weight: float = 0.3
    kind_weights: Mapping[str, float] = field(default_factory=dict)  # kind -> weight (absent: 1.0)


def rrf(legs: Sequence[Sequence[str]], k: float) -> dict[str, float]:
    """Reciprocal-rank fusion of ranked id lists (best first) -> id -> score."""
    scores: dict[str, float] = {}
    for leg in legs:
        for rank, uid in enumerate(leg, start=1):
            scores[uid] = scores.get(uid, 0.0) + 1.0 / (k + rank)
    return scores


def recency(age_s: float, half_life_days: float, weight: float) -> float:
    """1 for a unit updated now, falling to (1 - weight) as it ages (a half of the decaying share per
    half-life). Ages below zero (clock skew) count as zero."""
    return (1.0 - weight) + weight * 0.5 ** (max(age_s, 0.0) / (half_life_days * DAY_S))


def fuse(legs: Sequence[Sequence[str]], units: Mapping[str, MemoryUnit], now: float,
         w: FusionWeights) -> list[tuple[MemoryUnit, float]]:
    """Units of `units` found by any leg, with their fused score, best first (ties: unit id)."""
    out = []
    for uid, base in rrf(legs, w.rrf_k).items():
        u = units.get(uid)
        if u is None:  # not fetched: deleted meanwhile, superseded, or outside the request's scopes
            continue
        score = (base * w.kind_weights.get(u.kind.value, 1.0)
                 * recency(now - u.updated_at, w.recency_half_life_days, w.recency_weight)
                 * (0.5 + 0.5 * u.confidence))
        out.append((u, score))
    out.sort(key=lambda p: (-p[1], p[0].unit_id))
    return out
