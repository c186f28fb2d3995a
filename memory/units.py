"""Memory units and scopes: the records of the memory plane.

A unit is one remembered thing (five kinds, `Kind`) in one scope. Scopes nest: `user` (everything the user
said about themself, across workspaces) ⊃ `workspace` (one project of that user) ⊃ `session` (one
conversation). A scope is identified by ALL of its ids, never by a joined string, so no choice of ids can
make two users' scopes meet (a user "a/b" in workspace "c" is not user "a" in workspace "b/c").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import Field, field_validator, model_validator

from core.contracts import Record, new_id, now

MAX_CONTENT_CHARS = 1000
MAX_KEY_CHARS = 80


class Kind(StrEnum):
    episodic = "episodic"  # what happened ("on 2026-11-30 the user asked about ...")
    semantic = "semantic"  # facts ("the user's deploy target is eu-west-1")
    preference = "preference"  # how the user likes things ("the user prefers tabs")
    project_state = "project_state"  # where a piece of work stands ("the migration is blocked")
    working_summary = "working_summary"  # a rolling summary of one long session


class Level(StrEnum):
    user = "user"
    workspace = "workspace"
    session = "session"


# Widest scope a request may read and its turns may write (`X-Memory-Scope`); `off` = no memory at all.
SCOPE_CAPS = ("user", "workspace", "session", "off")
_DEPTH = {Level.user: 0, Level.workspace: 1, Level.session: 2}


@dataclass(frozen=True)
class Scope:
    """One memory scope: the level and the ids that level needs (the others are None)."""

    level: Level
    user: str
    workspace: str | None = None
    session: str | None = None

    def __post_init__(self) -> None:
        need_ws, need_s = self.level != Level.user, self.level == Level.session
        if not self.user or (self.workspace is not None) != need_ws or (self.session is not None) != need_s:
            raise ValueError(f"scope {self.level.value} needs user"
                             f"{', workspace' if need_ws else ''}{', session' if need_s else ''} and no other id")

    @property
    def key(self) -> str:
        """A stable hex id of the whole tuple (JSON-encoded, so separators inside ids cannot collide)."""
        raw = json.dumps([self.level.value, self.user, self.workspace, self.session])
        return hashlib.sha256(raw.encode()).hexdigest()[:24]

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level.value, "user": self.user, "workspace": self.workspace,
                "session": self.session}


def scope_at(level: Level, user: str, workspace: str, session: str) -> Scope:
    """The scope of (user, workspace, session) at `level`."""
    return Scope(level, user, workspace if level != Level.user else None,
                 session if level == Level.session else None)


def capped(level: Level, cap: str) -> Level:
    """`level`, moved down to `cap` when `cap` is narrower: a turn never writes wider than its cap."""
    want = Level(cap)
    return want if _DEPTH[want] > _DEPTH[level] else level


def split_tenant(tenant: str) -> tuple[str, str]:
    """`"<user>/<workspace>"` (Turn.tenant) -> (user, workspace). User ids never contain "/" (the Proxy
    refuses them), so the first "/" is the separator; workspace ids may contain "/"."""
    user, sep, workspace = tenant.partition("/")
    if not sep or not user or not workspace:
        raise ValueError(f"tenant {tenant!r} is not <user>/<workspace>")
    return user, workspace


def request_scopes(user: str, workspace: str, session: str, cap: str = "user") -> list[Scope]:
    """The scopes a request of (user, workspace, session) reads under `cap`, narrowest first."""
    if cap not in SCOPE_CAPS:
        raise ValueError(f"memory scope must be one of {', '.join(SCOPE_CAPS)}, got {cap!r}")
    if cap == "off":
        return []
    levels = [lv for lv in (Level.session, Level.workspace, Level.user) if _DEPTH[lv] >= _DEPTH[Level(cap)]]
    return [scope_at(lv, user, workspace, session) for lv in levels]


class MemoryUnit(Record):
    """One remembered thing. Supersession keeps history: the old unit stays (status `superseded`,
    `superseded_by` set) and is never retrieved; the new one names it in `supersedes`."""

    unit_id: str = Field(default_factory=new_id)
    kind: Kind
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    key: str | None = Field(default=None, max_length=MAX_KEY_CHARS)  # slot ("editor"): one active per scope
    level: Level
    user: str
    workspace: str | None = None
    session: str | None = None
    source_session: str = ""  # the session it was extracted from
    source_turns: list[str] = Field(default_factory=list)  # turn ids it was extracted from
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)  # last extraction that confirmed it
    confidence: float = Field(default=0.5, ge=0, le=1)
    mentions: int = Field(default=1, ge=1)  # extractions merged into it (near duplicates)
    supersedes: str | None = None
    superseded_by: str | None = None

    @model_validator(mode="after")
    def _valid_scope(self) -> MemoryUnit:
        self.scope  # noqa: B018 - raises ValueError for an inconsistent set of ids
        return self

    @property
    def scope(self) -> Scope:
        return Scope(self.level, self.user, self.workspace, self.session)

    @property
    def active(self) -> bool:
        return self.superseded_by is None


class Candidate(Record):
    """A unit proposed by an extractor, before scoping and consolidation. `level` is the widest scope it
    belongs to (a preference: the user; a project fact: the workspace; a summary: the session)."""

    kind: Kind
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    key: str | None = Field(default=None, max_length=MAX_KEY_CHARS)
    level: Level
    confidence: float = Field(default=0.5, ge=0, le=1)
    source_turns: list[str] = Field(default_factory=list)

    @field_validator("content")
    @classmethod
    def _one_line(cls, v: str) -> str:
        v = " ".join(v.split())
        if not v:
            raise ValueError("content is empty")
        return v

    @field_validator("key")
    @classmethod
    def _norm_key(cls, v: str | None) -> str | None:
        return normalize_key(v) if v else None


def normalize_key(key: str) -> str:
    """Slot keys compare case- and spacing-insensitively ("Preferred Editor" == "preferred editor")."""
    return " ".join(key.lower().split())[:MAX_KEY_CHARS]
