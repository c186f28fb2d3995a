"""Adapters from eval specs and from MetaClaw-Bench command lines to the checks in `bench.py`.

Two ways in:
- a spec dict, `{"type": "iso8601", "file": "day01/a.json", "paths": ["items[].due"]}` (registry);
- an argv, `["check_iso8601.py", "day01/a.json", "items[].due"]`, for `file_check` commands that call
  the benchmark's scripts, which this project does not ship (`SCRIPTS`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rewards.checkers import bench
from rewards.checkers.base import CheckerSpecError, CheckResult, need_workspace


def _parse(args: list[str], flags: dict[str, type], script: str) -> tuple[list[str], dict[str, Any]]:
    """Split `args` into positionals and `--flag value` options (types from `flags`)."""
    pos: list[str] = []
    opts: dict[str, Any] = {}
    it = iter(args)
    for arg in it:
        if not arg.startswith("--"):
            pos.append(arg)
            continue
        if arg not in flags:
            raise CheckerSpecError(f"{script}: unknown option {arg} (valid: {', '.join(flags) or 'none'})")
        value = next(it, None)
        if value is None:
            raise CheckerSpecError(f"{script}: option {arg} needs a value")
        try:
            opts[arg[2:].replace("-", "_")] = flags[arg](value)
        except ValueError as e:
            raise CheckerSpecError(f"{script}: bad value for {arg}: {value!r}") from e
    return pos, opts


def _one(pos: list[str], script: str, what: str) -> str:
    if len(pos) != 1:
        raise CheckerSpecError(f"{script}: expected one {what}, got {len(pos)} argument(s)")
    return pos[0]


def cli_iso8601(args: list[str], ws: Path) -> CheckResult:
    pos, opts = _parse(args, {"--offset": str}, "check_iso8601.py")
    if len(pos) < 2:
        raise CheckerSpecError("check_iso8601.py: usage FILE PATH [PATH ...]")
    return bench.check_iso8601(ws, pos[0], pos[1:], **opts)


def cli_filename(args: list[str], ws: Path) -> CheckResult:
    flags = {"--dir": str, "--ext": str, "--min-count": int}
    pos, opts = _parse(args, flags, "check_filename.py")
    if "dir" in opts or "ext" in opts:
        if pos:
            raise CheckerSpecError("check_filename.py: give NAME or --dir/--ext, not both")
        return bench.check_filename(
            ws, directory=opts.get("dir"), ext=opts.get("ext"), min_count=opts.get("min_count", 1)
        )
    return bench.check_filename(ws, name=_one(pos, "check_filename.py", "NAME"))


def cli_metadata(args: list[str], ws: Path) -> CheckResult:
    pos, opts = _parse(args, {"--offset": str}, "check_metadata.py")
    return bench.check_metadata(ws, _one(pos, "check_metadata.py", "FILE"), **opts)


def cli_backup(args: list[str], ws: Path) -> CheckResult:
    pos, _ = _parse(args, {}, "check_backup.py")
    return bench.check_backup(ws, _one(pos, "check_backup.py", "FILE"))


def cli_done_log(args: list[str], ws: Path) -> CheckResult:
    # NOTE: `--min-count` is accepted and ignored. The benchmark's subset builder appends
    # `--min-count N` (meant for check_filename.py) to the end of chained commands, so in a few
    # rounds it lands on check_done_log.py.
    flags = {"--task-prefix": str, "--min-entries": int, "--min-count": int, "--offset": str}
    pos, opts = _parse(args, flags, "check_done_log.py")
    opts.pop("min_count", None)
    return bench.check_done_log(ws, _one(pos, "check_done_log.py", "LOG"), **opts)


SCRIPTS: dict[str, Callable[[list[str], Path], CheckResult]] = {
    "check_iso8601.py": cli_iso8601,
    "check_filename.py": cli_filename,
    "check_metadata.py": cli_metadata,
    "check_backup.py": cli_backup,
    "check_done_log.py": cli_done_log,
}


def _str(spec: dict[str, Any], key: str, checker: str) -> str:
    value = spec.get(key)
    if not isinstance(value, str) or not value:
        raise CheckerSpecError(f"{checker} needs {key!r} (a non-empty string)")
    return value


def iso8601(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """spec: {"file": str, "paths": [str, ...], "offset"?: "+08:00" | "Z" | "any"}."""
    ws = need_workspace(workspace, "iso8601")
    paths = spec.get("paths")
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        raise CheckerSpecError("iso8601 needs 'paths' (a non-empty list of JSON paths)")
    offset = spec.get("offset", bench.DEFAULT_OFFSET)
    return bench.check_iso8601(ws, _str(spec, "file", "iso8601"), paths, offset)


def filename(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """spec: {"name": str} or {"dir": str, "ext": str, "min_count"?: int}."""
    if "name" in spec:
        return bench.check_filename(Path("."), name=_str(spec, "name", "filename"))
    ws = need_workspace(workspace, "filename")
    min_count = spec.get("min_count", 1)
    if not isinstance(min_count, int) or min_count < 1:
        raise CheckerSpecError("filename 'min_count' must be an integer >= 1")
    return bench.check_filename(
        ws, directory=_str(spec, "dir", "filename"), ext=_str(spec, "ext", "filename"), min_count=min_count
    )


def metadata(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """spec: {"file": str, "offset"?: str}."""
    ws = need_workspace(workspace, "metadata")
    return bench.check_metadata(ws, _str(spec, "file", "metadata"), spec.get("offset", bench.DEFAULT_OFFSET))


def backup(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """spec: {"file": str}."""
    return bench.check_backup(need_workspace(workspace, "backup"), _str(spec, "file", "backup"))


def done_log(spec: dict[str, Any], reply: str, workspace: Path | None) -> CheckResult:
    """spec: {"log"?: "done.log", "task_prefix"?: str, "min_entries"?: int, "offset"?: str}."""
    ws = need_workspace(workspace, "done_log")
    min_entries = spec.get("min_entries", 1)
    if not isinstance(min_entries, int) or min_entries < 0:
        raise CheckerSpecError("done_log 'min_entries' must be an integer >= 0")
    return bench.check_done_log(
        ws,
        spec.get("log", "done.log"),
        task_prefix=spec.get("task_prefix"),
        min_entries=min_entries,
        offset=spec.get("offset", bench.DEFAULT_OFFSET),
    )
