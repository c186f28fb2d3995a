"""Judge vote parsing and majority voting (pure; no I/O).

A judge reply ends with `Score: 1`, `Score: 0` or `Score: -1`; `\\boxed{N}` is accepted as a fallback
(older judge prompts). The last occurrence wins, because judges often quote the format or change their
mind while reasoning before the final verdict.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

SCORE_RE = re.compile(r"score\**\s*[:=]\s*\**\s*([-+]?\d+)(?![.\d])", re.IGNORECASE)
BOXED_RE = re.compile(r"\\boxed\{\s*([-+]?\d+)\s*\}")
VALID_SCORES = (-1, 0, 1)


def _last_valid(matches: list[str]) -> int | None:
    for raw in reversed(matches):
        value = int(raw)
        if value in VALID_SCORES:
            return value
    return None


def parse_score(text: str) -> int | None:
    """The judge's verdict in {-1, 0, 1}, or None when the reply holds no valid verdict.

    `Score: N` takes precedence over `\\boxed{N}`; within a format the last valid occurrence wins;
    out-of-range numbers (e.g. `Score: 7`) are ignored.
    """
    if not text:
        return None
    found = _last_valid(SCORE_RE.findall(text))
    return found if found is not None else _last_valid(BOXED_RE.findall(text))


def majority_vote(scores: Sequence[int | None]) -> int:
    """The most common valid score; 0 on a tie between the most common ones or when none is valid.

    Unparseable votes (None) abstain, as in MetaClaw: [1, None, None] -> 1, [1, -1, None] -> 0.
    """
    counts = Counter(s for s in scores if s is not None)
    if not counts:
        return 0
    (top, n), *rest = counts.most_common()
    if rest and rest[0][1] == n:
        return 0
    return top
