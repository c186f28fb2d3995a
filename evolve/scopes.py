"""Skill scopes: who a skill is served to. Pure functions.

A skill's scope is `metadata.scope` in its SKILL.md:
    global                          every request (also: no scope at all, so existing libraries load as before)
    user:<user>                     requests of that user (X-User-Id), in any workspace
    workspace:<user>/<workspace>    requests of that user in that workspace (the Turn's tenant)
    group:<name>                    requests of the users `skills.groups[<name>]` lists
A request sees the union: the global skills plus those of its user, its workspace and its groups. A scope
that is not one of these forms is visible to no one (logged by the bank's reader), never to everyone: a
typo must not publish a private lesson.

Skill names are unique across scopes (one folder per name), so the fast loop, writing a lesson private to
the user whose session taught it, names it apart from skills of other scopes (`private_name`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

from core.contracts import Skill

GLOBAL = "global"
# User ids are any printable ASCII without "/" (the Proxy refuses "/"), spaces included; workspace ids may
# hold "/" themselves.
_SCOPE_RE = re.compile(r"^(user|group):[^/]+$|^workspace:[^/]+/.+$")


def scope_of(skill: Skill) -> str:
    """The skill's scope string as written ("global" when it has none)."""
    raw = skill.metadata.get("scope")
    return GLOBAL if raw is None or raw == "" else str(raw)


def valid_scope(scope: str) -> bool:
    return scope == GLOBAL or bool(_SCOPE_RE.match(scope))


def check_scope(scope: str) -> str:
    """`scope` if valid; ValueError naming the valid forms otherwise."""
    if not valid_scope(scope):
        raise ValueError(f"invalid skill scope {scope!r}: use global, user:<user>, workspace:<user>/<workspace> "
                         "or group:<name>")
    return scope


def tenant_scope(tenant: str, level: str, groups: Mapping[str, Sequence[str]] | None = None) -> str:
    """The scope a fast-loop lesson of `tenant` ("<user>/<workspace>") gets at `level` (`evolver.scope`):
    global, user, workspace, or group (the first group, by name, that lists the user; a user in no
    group keeps the lesson private)."""
    if level == GLOBAL:
        return GLOBAL
    user, _, workspace = tenant.partition("/")
    if level == "group":
        mine = sorted(g for g, members in (groups or {}).items() if user in members)
        return f"group:{mine[0]}" if mine else f"user:{user}"
    return f"user:{user}" if level == "user" else f"workspace:{user}/{workspace or 'default'}"


def request_scopes(tenant: str, groups: Mapping[str, Sequence[str]] | None = None) -> frozenset[str]:
    """The private scopes a request of `tenant` sees besides the global skills."""
    user, _, workspace = tenant.partition("/")
    out = {f"user:{user}", f"workspace:{user}/{workspace or 'default'}"}
    out.update(f"group:{g}" for g, members in (groups or {}).items() if user in members)
    return frozenset(out)


def visible(skill: Skill, scopes: frozenset[str]) -> bool:
    s = scope_of(skill)
    return s == GLOBAL or s in scopes


def split_by_scope(skills: Iterable[Skill]) -> tuple[list[Skill], dict[str, list[Skill]], list[str]]:
    """(global skills, private skills by scope, names of skills with an invalid scope: served to no one)."""
    shared: list[Skill] = []
    private: dict[str, list[Skill]] = {}
    bad: list[str] = []
    for s in skills:
        scope = scope_of(s)
        if scope == GLOBAL:
            shared.append(s)
        elif valid_scope(scope):
            private.setdefault(scope, []).append(s)
        else:
            bad.append(s.name)
    return shared, private, bad


def private_name(name: str, scope: str, taken: Iterable[str]) -> str:
    """`name`, or (when another scope's skill has it) `name` with a stable suffix of `scope`."""
    names = set(taken)
    if name not in names:
        return name
    suffix = hashlib.sha1(scope.encode()).hexdigest()[:6]
    return f"{name[:57].rstrip('-')}-{suffix}"
