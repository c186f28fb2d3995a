"""Programmatic reward checkers: a registry name -> pure function, and one entry point `evaluate`.

Every checker has the signature `(spec: dict, reply: str, workspace: Path | None) -> CheckResult`:
`spec` is the per-round eval dict minus its `type`, `reply` the assistant's text, `workspace` the
directory the round's files live in. Checkers only read files (except `command`/`file_check`, which
run commands there).

Eval specs (the `clawray_eval` a client sends with a request, or a benchmark round's `eval`):
    {"type": "multi_choice", "options": {"A": ..}, "answer": ["A", "C"]}
    {"type": "file_check", "command": "python check_iso8601.py f.json a.b", "expect_exit": 0}
    {"type": "<checker name>", ...its arguments}
An optional `"workspace": "<relative dir>"` narrows the workspace; it must resolve inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from rewards.checkers import bench_cli, choice, command, style
from rewards.checkers.base import CheckerSpecError, CheckResult, PathEscape, resolve_inside

Checker = Callable[[dict[str, Any], str, Path | None], CheckResult]

CHECKERS: dict[str, Checker] = {
    "multi_choice": choice.multi_choice,
    "iso8601": bench_cli.iso8601,
    "filename": bench_cli.filename,
    "metadata": bench_cli.metadata,
    "backup": bench_cli.backup,
    "done_log": bench_cli.done_log,
    "command": command.command,
    "file_check": command.file_check,
    "lowercase": style.lowercase,
    "uppercase": style.uppercase,
}

__all__ = [
    "CHECKERS",
    "CheckResult",
    "CheckerSpecError",
    "PathEscape",
    "UnknownChecker",
    "evaluate",
    "get_checker",
    "resolve_inside",
    "spec_type",
]


class UnknownChecker(CheckerSpecError):
    """A checker name that is not registered (or not enabled); the message lists the valid ones."""


def get_checker(name: str) -> Checker:
    try:
        return CHECKERS[name]
    except KeyError:
        raise UnknownChecker(f"unknown checker {name!r}; valid: {', '.join(sorted(CHECKERS))}") from None


def spec_type(eval_spec: dict[str, Any]) -> str:
    """The checker name an eval spec asks for; CheckerSpecError if it has none."""
    kind = eval_spec.get("type") if isinstance(eval_spec, dict) else None
    if not isinstance(kind, str) or not kind:
        raise CheckerSpecError(f"eval spec needs a 'type'; valid: {', '.join(sorted(CHECKERS))}")
    return kind


# Keys of a spec that are about where it runs, not arguments of its checker: `workspace` (the user's
# folder under the workspace root) and `workspace_before` (a snapshot of it at the task's start, from which
# the validation gate replays the task with its tools: evolve/sandbox.py).
SPEC_KEYS = ("type", "workspace", "workspace_before")


def evaluate(
    eval_spec: dict[str, Any],
    reply_text: str,
    workspace: Path | None,
    *,
    allowed: Collection[str] | None = None,
) -> CheckResult:
    """Run the checker named by `eval_spec["type"]` on the reply and the workspace.

    Args:
        eval_spec: the per-round dict (see module docstring).
        reply_text: the assistant's reply (only `multi_choice` reads it; `command` may get it on stdin).
        workspace: the root directory the spec's files and commands live under; None for
            reply-only checks. A spec's `"workspace"` sub-directory must resolve inside it.
        allowed: checker names enabled by config (None = all). `file_check` runs non-built-in
            commands only when `command` is allowed too.
    Returns:
        CheckResult with score in [0, 1].
    Raises:
        CheckerSpecError (UnknownChecker, PathEscape): the spec cannot be evaluated.
    """
    name = spec_type(eval_spec)
    checker = get_checker(name)
    if allowed is not None and name not in allowed:
        raise UnknownChecker(
            f"checker {name!r} is not enabled; enabled: {', '.join(sorted(allowed)) or 'none'}"
        )
    args = {k: v for k, v in eval_spec.items() if k not in SPEC_KEYS}
    if workspace is not None and eval_spec.get("workspace") is not None:
        workspace = resolve_inside(Path(workspace), str(eval_spec["workspace"]))
    if name == "file_check":
        allow = allowed is None or "command" in allowed
        return command.file_check(args, reply_text, workspace, allow_commands=allow)
    return checker(args, reply_text, workspace)
