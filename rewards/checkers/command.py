"""Run-a-command checks: `command` (an argv list) and `file_check` (a MetaClaw-Bench command string).

No shell ever runs. `command` takes an argv list; `file_check` reads its string with `shellparse`
(`&&` chains, `$(...)`), dispatches `python .../check_X.py ...` to the built-in checks of
`bench_cli.SCRIPTS` (so benchmark rounds replay without the benchmark's scripts) and runs any other
simple command as an argv. The model's reply is never put into an argv: a command can receive it
only on stdin (`"stdin_reply": true`).

Commands run in the workspace (which must resolve inside the root it was given), in their own
process group (killed whole on timeout), with a minimal environment, so the scorer's secrets (API
keys in its env) never reach them. `python`/`python3` as argv[0] mean this interpreter.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewards.checkers.base import CheckerSpecError, CheckResult, need_workspace
from rewards.checkers.bench_cli import SCRIPTS
from rewards.checkers.shellparse import PH_CLOSE, PH_OPEN, Simple, parse_command

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 600.0
MAX_OUTPUT_CHARS = 64 * 1024
PYTHONS = ("python", "python3")
PH_RE = re.compile(re.escape(PH_OPEN) + r"(\d+)" + re.escape(PH_CLOSE))


@dataclass(frozen=True)
class Outcome:
    """What one command (or chain) did: exit code, stdout, and a one-line description."""

    exit_code: int
    stdout: str
    detail: str


class _Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


def _env(cwd: Path) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    return {**keep, "HOME": str(cwd), "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}


def run_argv(argv: list[str], cwd: Path, timeout_s: float, stdin: str | None = None) -> Outcome:
    """Run `argv` (no shell) in `cwd`; exit 124 on timeout, 127 when the program is not found."""
    if not argv or not all(isinstance(a, str) for a in argv):
        raise CheckerSpecError("argv must be a non-empty list of strings")
    shown = " ".join(argv[:3])[:80]
    argv = [sys.executable if argv[0] in PYTHONS else argv[0], *argv[1:]]
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=_env(cwd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
        )
    except (FileNotFoundError, PermissionError) as e:
        return Outcome(127, "", f"cannot run {argv[0]!r}: {type(e).__name__}")
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: children of the command too
        proc.communicate()
        return Outcome(124, "", f"timed out after {timeout_s:.0f}s: {shown}")
    tail = (err or "").strip().splitlines()[-1:] or [""]
    return Outcome(proc.returncode, out[:MAX_OUTPUT_CHARS], f"exit {proc.returncode} from {shown} {tail[0][:200]}".strip())


def _builtin(words: list[str]) -> str | None:
    """The bench script a `python .../check_X.py` command calls, if it is one of SCRIPTS."""
    if len(words) >= 2 and Path(words[0]).name in PYTHONS and Path(words[1]).name in SCRIPTS:
        return Path(words[1]).name
    return None


def _expand(cmd: Simple, cwd: Path, deadline: _Deadline, allow: bool) -> list[str]:
    """The argv of `cmd` with each `$(...)` replaced by its output (trailing newlines removed)."""
    outputs = [_run_simple(sub, cwd, deadline, allow, None).stdout.rstrip("\n") for sub in cmd.subs]
    return [PH_RE.sub(lambda m: outputs[int(m.group(1))], w) for w in cmd.words]


def _run_simple(cmd: Simple, cwd: Path, deadline: _Deadline, allow: bool, stdin: str | None) -> Outcome:
    words = _expand(cmd, cwd, deadline, allow)
    script = _builtin(words)
    if script is not None:
        result = SCRIPTS[script](words[2:], cwd)
        return Outcome(0 if result.passed else 1, result.reason + "\n", f"{script}: {result.reason}")
    if not allow:
        raise CheckerSpecError(
            f"command {words[0]!r} is not a built-in check; running commands needs the 'command' "
            f"checker enabled (built-ins: {', '.join(SCRIPTS)})"
        )
    if deadline.left() <= 0:
        return Outcome(124, "", "timed out before the command started")
    return run_argv(words, cwd, deadline.left(), stdin)


def run_chain(chain: list[Simple], cwd: Path, timeout_s: float, allow: bool, stdin: str | None = None) -> Outcome:
    """`a && b && c`: stop at the first non-zero exit; stdout is everything printed so far."""
    deadline = _Deadline(timeout_s)
    printed: list[str] = []
    outcome = Outcome(0, "", "")
    for cmd in chain:
        outcome = _run_simple(cmd, cwd, deadline, allow, stdin)
        printed.append(outcome.stdout)
        if outcome.exit_code != 0:
            break
    return Outcome(outcome.exit_code, "".join(printed)[:MAX_OUTPUT_CHARS], outcome.detail)


def _timeout(spec: dict[str, Any]) -> float:
    t = spec.get("timeout", DEFAULT_TIMEOUT_S)
    if not isinstance(t, (int, float)) or not 0 < t <= MAX_TIMEOUT_S:
        raise CheckerSpecError(f"'timeout' must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]")
    return float(t)


def verdict(spec: dict[str, Any], outcome: Outcome, checker: str) -> CheckResult:
    """Compare with `expect_exit` (default 0), `expect_stdout` (substring of stdout, stripped) and
    `expect_stdout_regex` (re.search, multiline). All given expectations must hold."""
    want_exit = spec.get("expect_exit", 0)
    if not isinstance(want_exit, int):
        raise CheckerSpecError("'expect_exit' must be an integer")
    problems = []
    if outcome.exit_code != want_exit:
        problems.append(f"exit {outcome.exit_code} != {want_exit}")
    want_out = spec.get("expect_stdout")
    if want_out is not None and str(want_out).strip() not in outcome.stdout:
        problems.append(f"stdout lacks {str(want_out).strip()[:60]!r}")
    pattern = spec.get("expect_stdout_regex")
    if pattern is not None:
        try:
            if not re.search(pattern, outcome.stdout, re.M):
                problems.append(f"stdout does not match /{pattern[:60]}/")
        except re.error as e:
            raise CheckerSpecError(f"bad 'expect_stdout_regex': {e}") from e
    if problems:
        return CheckResult(0.0, False, f"{'; '.join(problems)} ({outcome.detail})", checker)
    return CheckResult(1.0, True, outcome.detail or "command met its expectations", checker)


def command(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """spec: {"argv": [str, ...], "expect_exit"?: 0, "expect_stdout"?: str,
    "expect_stdout_regex"?: str, "timeout"?: 30, "stdin_reply"?: false}."""
    ws = need_workspace(workspace, "command")
    argv = spec.get("argv")
    if isinstance(argv, str):
        raise CheckerSpecError("'argv' must be a list of strings, not a shell string")
    if not isinstance(argv, list):
        raise CheckerSpecError("command needs 'argv' (a list of strings)")
    stdin = reply if spec.get("stdin_reply") else None
    return verdict(spec, run_argv(argv, ws, _timeout(spec), stdin), "command")


def file_check(
    spec: dict[str, Any], reply: str, workspace: Path | None, *, allow_commands: bool = True
) -> CheckResult:
    """spec: {"command": str, "expect_exit"?: 0, "expect_stdout"?: str,
    "expect_stdout_regex"?: str, "timeout"?: 30} (MetaClaw-Bench `file_check` eval).

    allow_commands: whether simple commands other than the built-in bench checks may run.
    """
    ws = need_workspace(workspace, "file_check")
    chain = parse_command(spec.get("command", ""))
    return verdict(spec, run_chain(chain, ws, _timeout(spec), allow_commands), "file_check")
