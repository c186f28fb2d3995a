"""Read and rewrite agent config files (JSON, YAML, TOML, .env) so that only the keys clawray sets change.

`load(fmt, text)` parses a file's text into a document (a dict); `render(fmt, text, old, new)` gives the
new text for document `new`. Text that is not in the expected format raises `FormatError`, and the
caller then leaves the file untouched. JSON and YAML are re-serialised (their comments do not survive;
the backup keeps the original bytes). TOML and .env are edited line by line, so comments and layout
stay; a TOML edit is checked by parsing the result, and refused when it would change anything else.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import yaml

FORMATS = ("json", "yaml", "toml", "env")


class FormatError(ValueError):
    """The file is not in the format the agent uses, or cannot be edited safely."""


def load(fmt: str, text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        doc = _LOADERS[fmt](text)
    except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise FormatError(f"not valid {fmt.upper()} ({_first_line(e)})") from None
    if not isinstance(doc, dict):
        raise FormatError(f"the top level is a {type(doc).__name__}, not a {fmt.upper()} mapping")
    return doc


def render(fmt: str, text: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    if fmt == "json":
        return json.dumps(new, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(new, sort_keys=False, allow_unicode=True, default_flow_style=False)
    if fmt == "toml":
        return _render_toml(text, old, new)
    return _render_env(text, new)


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# ---- .env -----------------------------------------------------------------------------------------

_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _load_env(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise ValueError(f"line {n} is not KEY=VALUE")
        value = m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[m.group(1)] = value
    return out


def _env_value(v: str) -> str:
    return v if re.fullmatch(r"[A-Za-z0-9_./:@+-]*", v) else json.dumps(v)


def _render_env(text: str, new: dict[str, str]) -> str:
    """Rewrite the lines of changed keys in place, drop the lines of removed keys, append new keys."""
    old = _load_env(text)
    parsed = [(line, _ENV_LINE.match(line) if line.strip() and not line.lstrip().startswith("#") else None)
              for line in text.splitlines()]
    last = {m.group(1): i for i, (_, m) in enumerate(parsed) if m}  # a repeated key: the last line counts
    lines, seen = [], set()
    for i, (line, m) in enumerate(parsed):
        if m is None:
            lines.append(line)
            continue
        key = m.group(1)
        if key not in new or last[key] != i:
            continue
        seen.add(key)
        lines.append(line if old.get(key) == new[key] else f"{key}={_env_value(new[key])}")
    lines += [f"{k}={_env_value(v)}" for k, v in new.items() if k not in seen]
    return "\n".join(lines) + "\n"


# ---- TOML -----------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_HEADER = re.compile(r"^\s*\[")


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise FormatError(f"cannot write a {type(v).__name__} to TOML")


def _header_path(line: str) -> tuple[str, ...] | None:
    """The key path of a `[a.b]` table header line (tomllib reads it, so quoting rules are TOML's)."""
    try:
        doc = tomllib.loads(line.strip().lstrip("[").rstrip("]").join("[]"))
    except tomllib.TOMLDecodeError:
        return None
    path = []
    while isinstance(doc, dict) and len(doc) == 1:
        k, doc = next(iter(doc.items()))
        path.append(k)
    return tuple(path)


def _changes(old: dict, new: dict, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The smallest (path, new value) edits turning `old` into `new`; removals are not supported."""
    if set(old) - set(new):
        raise FormatError(f"cannot remove TOML keys {sorted(set(old) - set(new))}")
    out = []
    for k, v in new.items():
        if k in old and old[k] == v:
            continue
        if isinstance(v, dict) and not _is_leaf_table(v) and isinstance(old.get(k, {}), dict):
            out += _changes(old.get(k, {}), v, (*path, k))
        else:
            out.append(((*path, k), v))
    return out


def _is_leaf_table(v: dict) -> bool:
    """A table written as one `[header]` block: its values are scalars, lists or flat inline tables."""
    return all(not isinstance(x, dict) or not any(isinstance(y, dict) for y in x.values()) for x in v.values())


def _render_toml(text: str, old: dict, new: dict) -> str:
    lines = text.splitlines()
    first_table = next((i for i, ln in enumerate(lines) if _HEADER.match(ln)), len(lines))
    root, tables = lines[:first_table], lines[first_table:]
    appended: list[str] = []
    for path, value in _changes(old, new):
        if isinstance(value, dict):
            tables = _drop_table(tables, path)
            appended += ["", f"[{'.'.join(_key(k) for k in path)}]"]
            appended += [f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()]
        elif len(path) == 1:
            root = _set_root_key(root, path[0], value)
        else:
            raise FormatError(f"cannot set the nested TOML key {'.'.join(path)} in place")
    while tables and not tables[-1].strip():
        tables = tables[:-1]
    out = "\n".join([*root, *tables, *appended]).strip("\n") + "\n"
    unsafe = "the TOML layout (dotted keys or inline tables) cannot be edited safely"
    try:
        written = tomllib.loads(out)
    except tomllib.TOMLDecodeError as e:
        raise FormatError(f"{unsafe}: the edit would not parse ({_first_line(e)})") from None
    if written != new:
        raise FormatError(unsafe)
    return out


def _set_root_key(root: list[str], key: str, value: Any) -> list[str]:
    pat = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\")\s*=")
    line = f"{_key(key)} = {_toml_value(value)}"
    for i, ln in enumerate(root):
        if pat.match(ln):
            return [*root[:i], line, *root[i + 1:]]
    # Root keys must come before the first table: insert after the root's last non-blank line.
    end = max((i + 1 for i, ln in enumerate(root) if ln.strip()), default=0)
    return [*root[:end], line, *root[end:]]


def _drop_table(tables: list[str], path: tuple[str, ...]) -> list[str]:
    """Remove the `[path]` table and its sub-tables (`[path.x]`) from the table section."""
    out, dropping = [], False
    for ln in tables:
        if _HEADER.match(ln):
            hp = _header_path(ln)
            dropping = hp is not None and hp[:len(path)] == path
        if not dropping:
            out.append(ln)
    return out


_LOADERS = {"json": json.loads, "yaml": yaml.safe_load, "toml": tomllib.loads, "env": _load_env}
