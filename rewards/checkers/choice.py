"""Multi-choice answers: `\\bbox{A,C}` or `\\boxed{A,C}` in the reply (MetaClaw-Bench format)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rewards.checkers.base import CheckerSpecError, CheckResult

BOX_RE = re.compile(r"\\(?:bbox|boxed)\{([^{}]*)\}")
SEP_RE = re.compile(r"[\s,;/]+")


def parse_choices(reply: str, letters: set[str]) -> set[str] | None:
    """The letters in the reply's last box, upper-cased; None when the reply has no box.

    `A,C`, `A, C`, `A C` and `AC` (when every character is an option letter) all mean {A, C}; any
    other token (e.g. `None`) is kept as-is and so counts as a wrong selection.
    """
    boxes = BOX_RE.findall(reply or "")
    if not boxes:
        return None
    chosen: set[str] = set()
    for token in SEP_RE.split(boxes[-1].strip().upper()):
        if not token:
            continue
        if len(token) > 1 and set(token) <= letters:
            chosen.update(token)
        else:
            chosen.add(token)
    return chosen


def multi_choice(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """Score 1 - (false positives + false negatives) / number of options, floored at 0; no box -> 0.

    spec: {"options": {"A": ..., ...}, "answer": ["A", "C"]}.
    """
    options, answer = spec.get("options"), spec.get("answer")
    if not isinstance(options, dict) or not options:
        raise CheckerSpecError("multi_choice needs a non-empty 'options' mapping")
    if not isinstance(answer, list) or not all(isinstance(a, str) for a in answer):
        raise CheckerSpecError("multi_choice needs 'answer' as a list of option letters")
    letters = {str(k).upper() for k in options}
    truth = {a.upper() for a in answer}
    if not truth <= letters:
        raise CheckerSpecError(f"multi_choice answer {sorted(truth - letters)} is not among the options")
    chosen = parse_choices(reply, letters)
    if chosen is None:
        return CheckResult(0.0, False, "no \\bbox{...} or \\boxed{...} answer in the reply", "multi_choice")
    fp, fn = len(chosen - truth), len(truth - chosen)
    score = max(0.0, 1.0 - (fp + fn) / len(letters))
    reason = f"chose {','.join(sorted(chosen)) or '-'}; expected {','.join(sorted(truth))}"
    return CheckResult(score, fp == 0 and fn == 0, f"{reason} (fp={fp}, fn={fn})", "multi_choice")
