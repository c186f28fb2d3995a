"""Reply-style preferences scored with partial credit (e.g. "Mei wants status updates in lowercase, ticket
titles in uppercase")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rewards.checkers.base import CheckerSpecError, CheckResult


def _case(spec: dict[str, Any], reply: str, name: str, lower: bool) -> CheckResult:
    """Share of the reply's letters in the wanted case; passes at `threshold` (default 0.95).

    Partial credit on purpose: it gives GRPO a graded signal (a reply with fewer letters in the wrong case
    is better), not only pass/fail. No letters at all scores 0.
    """
    threshold = spec.get("threshold", 0.95)
    if not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise CheckerSpecError(f"{name}: threshold must be a number in (0, 1]")
    letters = [c for c in reply or "" if c.isalpha()]
    if not letters:
        return CheckResult(0.0, False, "the reply has no letters", name)
    share = sum((c.islower() if lower else c.isupper()) for c in letters) / len(letters)
    passed = share >= threshold
    why = f"all {name}" if share == 1 else f"{share:.0%} of the letters are {name}"
    return CheckResult(round(share, 4), passed, why, name)


def lowercase(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """Share of the reply's letters that are lowercase (see `_case`)."""
    return _case(spec, reply, "lowercase", lower=True)


def uppercase(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """Share of the reply's letters that are uppercase (see `_case`)."""
    return _case(spec, reply, "uppercase", lower=False)
