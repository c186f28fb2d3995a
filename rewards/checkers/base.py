"""What every checker returns and the path rule every checker obeys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one programmatic check.

    score: credit in [0, 1] (1 = fully correct; multi_choice gives partial credit, file checks 0 or 1).
    passed: the check's own verdict (score == 1 for binary checks).
    reason: why, in one line, for audit and for the evolver.
    checker: the registry name that produced it (e.g. "iso8601", "file_check").
    """

    score: float
    passed: bool
    reason: str
    checker: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"CheckResult.score must be in [0, 1], got {self.score}")


def ok(reason: str, checker: str = "") -> CheckResult:
    return CheckResult(1.0, True, reason, checker)


def fail(reason: str, checker: str = "") -> CheckResult:
    return CheckResult(0.0, False, reason, checker)


class CheckerSpecError(ValueError):
    """An eval spec that cannot be evaluated (unknown checker, missing argument, a path outside the
    workspace, unsupported shell syntax). A problem of the spec's author, not of the model's reply."""


class PathEscape(CheckerSpecError):
    """A path that resolves outside the directory it must stay in."""


def resolve_inside(root: Path, rel: str | Path) -> Path:
    """`root / rel` with symlinks resolved; PathEscape if it is not inside `root` (`..`, an absolute
    `rel`, or a symlink pointing out)."""
    base = Path(root).resolve()
    target = (base / rel).resolve()
    if target != base and not target.is_relative_to(base):
        raise PathEscape(f"path {str(rel)!r} resolves outside {base}")
    return target


def need_workspace(workspace: Path | None, checker: str) -> Path:
    if workspace is None:
        raise CheckerSpecError(f"checker {checker!r} needs a workspace directory; none was given")
    if not Path(workspace).is_dir():
        raise CheckerSpecError(f"workspace {workspace} is not a directory")
    return Path(workspace)
