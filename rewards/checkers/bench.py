"""The five MetaClaw-Bench preference checks (P1-P5), re-implemented from their described behaviour.

Each check is a pure function of the workspace files, `check_<name>(workspace, ...) -> CheckResult`.
Every file argument is relative to the workspace and must resolve inside it; a path that escapes
(`..`, a symlink out) fails the check. `bench_cli.py` maps the benchmark's `python check_X.py ...`
command lines onto these functions.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from rewards.checkers.base import CheckResult, PathEscape, fail, ok, resolve_inside

DEFAULT_OFFSET = "+08:00"  # the benchmark's timezone (Asia/Shanghai)
FILENAME_RE = re.compile(r"^\d{8}_[a-z][a-z0-9_]*\.[a-z0-9]+$")  # YYYYMMDD_snake_case.ext
STATUSES = ("pending", "in_progress", "done")
MAX_SUMMARY_CHARS = 80


def iso_pattern(offset: str = DEFAULT_OFFSET) -> re.Pattern[str]:
    """`YYYY-MM-DDTHH:MM:SS(.fff)?<offset>`; offset "+08:00", "Z", or "any" (any explicit offset)."""
    tz = r"(?:Z|[+-]\d{2}:\d{2})" if offset == "any" else re.escape(offset)
    return re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?" + tz + "$")


def is_iso8601(value: Any, offset: str = DEFAULT_OFFSET) -> bool:
    """The shape above and a real calendar time (no month 13, no 25:00)."""
    if not isinstance(value, str) or not iso_pattern(offset).match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _read(workspace: Path, rel: str, checker: str) -> tuple[str | None, CheckResult | None]:
    """File text, or a failing result saying why it cannot be read."""
    try:
        path = resolve_inside(workspace, rel)
    except PathEscape as e:
        return None, fail(str(e), checker)
    if not path.is_file():
        return None, fail(f"{rel}: file not found", checker)
    try:
        return path.read_text(encoding="utf-8"), None
    except (OSError, UnicodeDecodeError) as e:
        return None, fail(f"{rel}: unreadable ({type(e).__name__})", checker)


def json_path_values(doc: Any, path: str) -> list[Any]:
    """Values at a dotted path; `name[]` iterates a list. Raises KeyError/TypeError with a reason.

    `json_path_values({"items": [{"d": 1}, {"d": 2}]}, "items[].d") == [1, 2]`.
    """
    values = [doc]
    for part in path.split("."):
        name, each = (part[:-2], True) if part.endswith("[]") else (part, False)
        nxt: list[Any] = []
        for v in values:
            if name:
                if not isinstance(v, dict) or name not in v:
                    raise KeyError(f"{path}: no key {name!r}")
                v = v[name]
            if each:
                if not isinstance(v, list):
                    raise TypeError(f"{path}: {name or 'value'} is not a list")
                nxt.extend(v)
            else:
                nxt.append(v)
        values = nxt
    return values


def check_iso8601(
    workspace: Path, file: str, paths: list[str], offset: str = DEFAULT_OFFSET
) -> CheckResult:
    """P1: every value at each JSON path is an ISO 8601 time with `offset`. An empty list at a
    `[]` path passes (nothing is wrong); a missing key fails."""
    name = "iso8601"
    if not paths:
        return fail("no JSON paths given", name)
    text, err = _read(workspace, file, name)
    if err:
        return err
    try:
        doc = json.loads(text or "")
    except json.JSONDecodeError as e:
        return fail(f"{file}: not valid JSON ({e.msg} at line {e.lineno})", name)
    bad: list[str] = []
    for path in paths:
        try:
            values = json_path_values(doc, path)
        except (KeyError, TypeError) as e:
            return fail(f"{file}: {e.args[0]}", name)
        bad += [f"{path}={v!r}" for v in values if not is_iso8601(v, offset)]
    if bad:
        return fail(f"{file}: not ISO 8601 with {offset}: {', '.join(bad[:5])}", name)
    return ok(f"{file}: {len(paths)} path(s) are ISO 8601 with {offset}", name)


def check_filename(
    workspace: Path,
    name: str | None = None,
    directory: str | None = None,
    ext: str | None = None,
    min_count: int = 1,
) -> CheckResult:
    """P2: `name` matches YYYYMMDD_snake_case.ext; or `directory` holds at least `min_count` files
    with extension `ext` whose names match. Other files with that extension are allowed (the
    benchmark's workspaces ship inputs such as README.md beside the agent's outputs)."""
    checker = "filename"
    if name is not None:
        base = Path(name).name
        if FILENAME_RE.match(base):
            return ok(f"{base} matches YYYYMMDD_snake_case.ext", checker)
        return fail(f"{base} does not match YYYYMMDD_snake_case.ext", checker)
    if directory is None or not ext:
        return fail("give a file name, or a directory and an extension", checker)
    try:
        folder = resolve_inside(workspace, directory)
    except PathEscape as e:
        return fail(str(e), checker)
    if not folder.is_dir():
        return fail(f"{directory}: directory not found", checker)
    suffix = "." + ext.lstrip(".").lower()
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() == suffix)
    good = [f for f in files if FILENAME_RE.match(f)]
    if len(good) >= min_count:
        return ok(f"{directory}: {len(good)} {suffix} file(s) named YYYYMMDD_snake_case", checker)
    others = ", ".join(f for f in files if f not in good) or "none"
    return fail(
        f"{directory}: {len(good)} {suffix} file(s) named YYYYMMDD_snake_case{suffix}, need "
        f"{min_count} (other {suffix} files: {others})",
        checker,
    )


def _front_matter(text: str) -> dict[str, Any] | None:
    m = re.match(r"^\ufeff?---\s*\n(.*?)\n---\s*(?:\n|$)", text, re.S)
    if not m:
        return None
    try:
        data = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _docstring_meta(text: str) -> dict[str, Any] | None:
    """A Python module docstring's `Meta:` section of indented `key: value` lines."""
    try:
        doc = ast.get_docstring(ast.parse(text))
    except SyntaxError:
        return None
    m = re.search(r"^Meta:\s*\n((?:[ \t]+\S.*(?:\n|$))+)", doc or "", re.M)
    if not m:
        return None
    pairs = (line.strip().split(":", 1) for line in m.group(1).splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _comment_meta(text: str) -> dict[str, Any] | None:
    """A first-line comment `# meta: created_at=... author=... status=...` (CSV and others)."""
    first = text.lstrip("\ufeff").split("\n", 1)[0]
    m = re.match(r"^#\s*meta:\s*(.*)$", first.strip(), re.I)
    if not m:
        return None
    return dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)


def extract_metadata(path: str, text: str) -> dict[str, Any] | None:
    """The metadata block of a file, by type: JSON top-level `meta`; Markdown YAML front matter;
    Python module docstring `Meta:` section; otherwise a first-line `# meta:` comment or front
    matter. The last two forms come from the benchmark's feedback texts for .py and .csv files."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return None
        meta = doc.get("meta") if isinstance(doc, dict) else None
        return meta if isinstance(meta, dict) else None
    if suffix == ".py":
        return _docstring_meta(text)
    return _front_matter(text) or _comment_meta(text)


def check_metadata(workspace: Path, file: str, offset: str = DEFAULT_OFFSET) -> CheckResult:
    """P3: non-empty `created_at` (ISO 8601 with offset), `author`, and `status` in STATUSES."""
    checker = "metadata"
    text, err = _read(workspace, file, checker)
    if err:
        return err
    meta = extract_metadata(file, text or "")
    if meta is None:
        return fail(f"{file}: no metadata block", checker)
    problems = []
    created = meta.get("created_at")
    if isinstance(created, datetime):  # YAML parses unquoted timestamps
        created = created.isoformat()
    if not is_iso8601(str(created or ""), offset):
        problems.append(f"created_at={created!r} is not ISO 8601 with {offset}")
    if not str(meta.get("author") or "").strip():
        problems.append("author is empty")
    if meta.get("status") not in STATUSES:
        problems.append(f"status={meta.get('status')!r} not in {list(STATUSES)}")
    if problems:
        return fail(f"{file}: " + "; ".join(problems), checker)
    return ok(f"{file}: metadata complete", checker)


def check_backup(workspace: Path, file: str) -> CheckResult:
    """P4: `file.bak` exists and its content differs from the (modified) `file`."""
    checker = "backup"
    try:
        target = resolve_inside(workspace, file)
        backup = resolve_inside(workspace, f"{file}.bak")
    except PathEscape as e:
        return fail(str(e), checker)
    if not backup.is_file():
        return fail(f"{file}.bak not found: back up before modifying", checker)
    if not target.is_file():
        return fail(f"{file} not found", checker)
    if backup.read_bytes() == target.read_bytes():
        return fail(f"{file}.bak is identical to {file}: the file was not modified", checker)
    return ok(f"{file}.bak exists and differs from {file}", checker)


def parse_done_line(line: str, offset: str = DEFAULT_OFFSET) -> tuple[str, str] | None:
    """(task_id, summary) of `[DONE] <ISO 8601> | <task id> | <summary <= 80 chars>`, else None."""
    if not line.startswith("[DONE] "):
        return None
    parts = line[len("[DONE] "):].split(" | ")
    if len(parts) != 3:
        return None
    ts, task, summary = (p.strip() for p in parts)
    if not is_iso8601(ts, offset) or not task or " " in task:
        return None
    if not summary or len(summary) > MAX_SUMMARY_CHARS:
        return None
    return task, summary


def check_done_log(
    workspace: Path,
    log: str,
    task_prefix: str | None = None,
    min_entries: int = 1,
    offset: str = DEFAULT_OFFSET,
) -> CheckResult:
    """P5: every non-blank line of `log` is a valid `[DONE]` entry, there are at least
    `min_entries`, and the last entry's task id starts with `task_prefix` (when given)."""
    checker = "done_log"
    text, err = _read(workspace, log, checker)
    if err:
        return err
    lines = [ln.rstrip("\r") for ln in (text or "").split("\n") if ln.strip()]
    entries = []
    for i, line in enumerate(lines, 1):
        parsed = parse_done_line(line, offset)
        if parsed is None:
            return fail(f"{log}:{i}: not '[DONE] <ISO 8601> | <task id> | <summary>': {line[:100]!r}", checker)
        entries.append(parsed)
    if len(entries) < min_entries:
        return fail(f"{log}: {len(entries)} entries, need at least {min_entries}", checker)
    if task_prefix and not entries[-1][0].startswith(task_prefix):
        return fail(f"{log}: last task id {entries[-1][0]!r} does not start with {task_prefix!r}", checker)
    return ok(f"{log}: {len(entries)} valid entries", checker)
