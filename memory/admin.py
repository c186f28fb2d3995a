"""Operator and user control, shared by `clawray memory ...` (memory/cli.py) and the Proxy's admin routes.

Every function takes the store and plain arguments and returns JSON-ready data; bad arguments raise
`AdminError` (the CLI prints it, the routes answer 400/404 with it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from memory.retrieval import MemorySearch
from memory.store import MemoryStore, UnitFilter
from memory.units import SCOPE_CAPS, Kind, Level, request_scopes

EXPORT_PAGE = 1000


class AdminError(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def unit_filter(user: str | None = None, workspace: str | None = None, session: str | None = None,
                level: str | None = None, kind: str | None = None, include_superseded: bool = False) -> UnitFilter:
    if session is not None and workspace is None:
        raise AdminError("a session is named by its workspace too: give the workspace")
    if workspace is not None and user is None:
        raise AdminError("a workspace belongs to a user: give the user")
    if level is not None and level not in Level.__members__:
        raise AdminError(f"level must be one of {', '.join(Level.__members__)}")
    if kind is not None and kind not in Kind.__members__:
        raise AdminError(f"kind must be one of {', '.join(Kind.__members__)}")
    return UnitFilter(user, workspace, session, level, Kind(kind) if kind else None, include_superseded)


def list_units(store: MemoryStore, flt: UnitFilter, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    return [u.model_dump(mode="json") for u in store.list_units(flt, max(1, min(limit, 10_000)), max(0, offset))]


def show(store: MemoryStore, unit_id: str) -> dict[str, Any]:
    """The unit with its supersession history (oldest first)."""
    chain = store.history(unit_id)
    unit = next((u for u in chain if u.unit_id == unit_id), None)
    if unit is None:
        raise AdminError(f"no memory unit {unit_id!r}", 404)
    return {"unit": unit.model_dump(mode="json"), "history": [u.model_dump(mode="json") for u in chain]}


def export(store: MemoryStore, flt: UnitFilter) -> Iterator[dict[str, Any]]:
    """Every unit the filter covers, superseded history included when asked, page by page."""
    offset = 0
    while page := store.list_units(flt, EXPORT_PAGE, offset):
        yield from (u.model_dump(mode="json") for u in page)
        offset += len(page)


def forget(store: MemoryStore, user: str | None, workspace: str | None = None, session: str | None = None,
           unit_id: str | None = None) -> dict[str, Any]:
    """Delete one unit, or everything of a user / workspace / session (the store's `forget`)."""
    if unit_id is not None:
        n = store.delete_units([unit_id])
        if not n:
            raise AdminError(f"no memory unit {unit_id!r}", 404)
        return {"deleted": n}
    if not user:
        raise AdminError("name what to forget: a user (and optionally its workspace and session) or a unit")
    unit_filter(user, workspace, session)
    return {"deleted": store.forget(user, workspace, session)}


def search(searcher: MemorySearch, query: str, user: str, workspace: str, session: str,
           cap: str = "user") -> list[dict[str, Any]]:
    """What a request of (user, workspace, session) with this last message would retrieve."""
    if cap not in SCOPE_CAPS:
        raise AdminError(f"scope must be one of {', '.join(SCOPE_CAPS)}")
    result = searcher.search(query, request_scopes(user, workspace, session, cap))
    return [{**u.model_dump(mode="json"), "score": round(score, 6)} for u, score in result.hits]
