"""SKILL.md parsing and rendering (DESIGN.md "Skill"; MetaClaw and SkillClaw layouts).

A SKILL.md is YAML front matter between two `---` lines, then a Markdown body:

    ---
    name: backup-before-modifying
    description: Create a .bak copy of a file before changing it.
    category: file_operations
    metadata:
      origin_sessions: [s1]
    ---

    # Backup before modifying
    ...

Compatibility rules (so existing MetaClaw / SkillClaw folders load unchanged):
- `category` is optional (default "general"); SkillClaw's `metadata.skillclaw.category` wins over it.
- Extra top-level keys (OpenClaw's `homepage`, `user-invocable`, `tags`, `version`, ...) are moved into
  `metadata` under their own key (a key already in `metadata` is kept and the top-level one goes to
  `metadata["frontmatter"]`), so nothing is lost; rendering writes them back inside `metadata`.
- Front matter that is not valid YAML (MetaClaw's own parser reads `key: value` lines, so its files may
  contain e.g. an unquoted `description: Use when: ...`) is read line by line the way MetaClaw does.
- Values YAML turns into dates or other non-JSON types are stored as strings, so metadata always
  serialises to JSON (history log, Ray).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from typing import Any

import yaml
from pydantic import ValidationError

from core.contracts import Skill

_CORE_KEYS = ("name", "description", "category", "metadata")
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster on a 10k-skill scan
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class SkillFormatError(ValueError):
    """A SKILL.md that cannot be read as a skill; the message says why."""


def _json_safe(value: Any) -> Any:
    """YAML values as JSON-compatible values (dates -> ISO strings, other scalars -> str)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, _dt.date | _dt.datetime | _dt.time):
        return value.isoformat()
    return str(value)


def split_front_matter(text: str) -> tuple[str, str]:
    """(front matter text, body) of a SKILL.md; raises SkillFormatError when there is none."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n")
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise SkillFormatError("no YAML front matter (the file must start with a '---' line)")
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            return "\n".join(lines[1:i]), "\n".join(lines[i + 1:]).strip()
    raise SkillFormatError("front matter is not closed by a '---' line")


def _line_front_matter(fm_text: str) -> dict[str, Any]:
    """MetaClaw's reader: one `key: value` per line, surrounding quotes stripped."""
    out: dict[str, Any] = {}
    for line in fm_text.splitlines():
        if ":" in line and not line.startswith((" ", "\t", "#")):
            key, _, val = line.partition(":")
            out[key.strip()] = val.strip().strip('"').strip("'")
    return out


def _load_front_matter(fm_text: str) -> dict[str, Any]:
    try:
        data = yaml.load(fm_text, Loader=_Loader)  # noqa: S506 - safe loader (CSafeLoader/SafeLoader)
    except yaml.YAMLError:
        data = _line_front_matter(fm_text)
        if "name" not in data:
            raise SkillFormatError("front matter is neither valid YAML nor `key: value` lines") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SkillFormatError("front matter must be a mapping of keys to values")
    return data


def _scalar(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, dict | list):
        raise SkillFormatError(f"front matter `{key}` must be a string, not a {type(value).__name__}")
    return str(value).strip()


def _metadata(data: dict[str, Any]) -> dict[str, Any]:
    raw = data.get("metadata")
    if raw is None:
        meta: dict[str, Any] = {}
    elif isinstance(raw, dict):
        meta = _json_safe(raw)
    else:
        raise SkillFormatError("front matter `metadata` must be a mapping")
    extra = {str(k): _json_safe(v) for k, v in data.items() if k not in _CORE_KEYS}
    for key, value in extra.items():
        if key in meta:
            meta.setdefault("frontmatter", {})[key] = value
        else:
            meta[key] = value
    return meta


def _category(data: dict[str, Any], meta: dict[str, Any]) -> str:
    sc = meta.get("skillclaw")
    if isinstance(sc, dict) and sc.get("category"):
        return str(sc["category"]).strip()
    return _scalar(data, "category") or "general"


def parse_skill_md(text: str, folder_name: str | None = None) -> Skill:
    """Parse a SKILL.md. `folder_name`, when given, must equal the front matter `name`.

    Raises SkillFormatError with a one-line reason for anything that is not a valid skill.
    """
    fm_text, body = split_front_matter(text)
    data = _load_front_matter(fm_text)
    name, description = _scalar(data, "name"), _scalar(data, "description")
    if not name:
        raise SkillFormatError("front matter has no `name`")
    if not description:
        raise SkillFormatError("front matter has no `description`")
    if folder_name is not None and name != folder_name:
        raise SkillFormatError(f"name {name!r} differs from its folder name {folder_name!r}")
    meta = _metadata(data)
    try:
        return Skill(name=name, description=description, category=_category(data, meta), body=body,
                     metadata=meta)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "skill"
        raise SkillFormatError(f"{field}: {first['msg']}") from None


def render_skill_md(skill: Skill) -> str:
    """The SKILL.md text of `skill` (metadata omitted when empty); parse_skill_md inverts it."""
    head: dict[str, Any] = {"name": skill.name, "description": skill.description,
                            "category": skill.category}
    if skill.metadata:
        head["metadata"] = skill.metadata
    fm = yaml.dump(head, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100_000,
                   default_flow_style=False)
    body = skill.body.strip()
    return f"---\n{fm}---\n\n{body}\n" if body else f"---\n{fm}---\n"


def content_key(skill: Skill) -> str:
    """Hash of what a reader sees (name, description, category, body) and who sees it (a scope other than
    global, evolve/scopes.py); other metadata excluded.

    Two skills with the same key inject the same text to the same requests, so a change of key is a change
    of the library (a new scope too: it bumps the generation like a new text).
    """
    h = hashlib.sha256()
    for part in (skill.name, skill.description, skill.category, skill.body.strip()):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    scope = skill.metadata.get("scope")
    if scope not in (None, "", "global"):
        h.update(f"scope={scope}".encode())
    return h.hexdigest()
