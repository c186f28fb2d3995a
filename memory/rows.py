"""What the two memory stores share (memory/sqlite_store.py, memory/pg_store.py): the row layout of a
unit and of an inbox turn, the SQL of filters and of a forget's owner (plain `?` SQL both engines run),
the supersession walk, the stats' shape and the choice of full-text query terms. Pure: no connection.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from memory.store import InboxEntry, UnitFilter
from memory.units import Kind, Level, MemoryUnit, Scope

TOMBSTONE_KEEP_S = 86400.0  # readers idle longer than this reload a scope instead of catching up
INBOX_DONE_KEEP_S = 86400.0  # a consumed turn's id is kept this long, so a re-delivery is ignored
MAX_QUERY_TERMS = 8
MAX_SOURCE_TURNS = 50  # turn ids a unit keeps (the newest)
ENCODER_META = "vector_encoder"  # the meta row naming the encoder of the stored vectors (memory/store.py)
REENCODE_SELECT = "SELECT rid, content FROM units WHERE vec IS NOT NULL ORDER BY rid"
REENCODE_UPDATE = "UPDATE units SET vec = ? WHERE rid = ?"
UNIT_COLS = ("unit_id, kind, content, key, level, user_id, workspace_id, session_id, source_session, "
             "source_turns, created_at, updated_at, confidence, mentions, supersedes, superseded_by")
INBOX_COLS = "turn_id, session_id, user_id, workspace_id, cap, turn_index, created_at, last, payload"


class Stale(Exception):
    """A consumed inbox turn was deleted meanwhile (forgotten): the batch must not be written."""


def owner_key(*ids: str) -> str:
    """Hash of (user[, workspace[, session]]): forgets are remembered without the ids themselves."""
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def owner_keys(user: str, workspace: str, session: str) -> list[str]:
    """The forget keys that cover a turn of (user, workspace, session): its user, workspace, session."""
    return [owner_key(user), owner_key(user, workspace), owner_key(user, workspace, session)]


class UnitRow(NamedTuple):
    """What fusion reads of a unit (memory/fusion.py), straight from its stored row (`UNIT_COLS`): the
    request path builds a `MemoryUnit` only for the few units it injects (building one costs ~20-70 us)."""

    unit_id: str
    kind: Kind
    updated_at: float
    confidence: float
    row: tuple


def unit_row(row: tuple) -> UnitRow:
    return UnitRow(row[0], Kind(row[1]), row[11], row[12], row)


def in_scopes(rows: Iterable[tuple], unit_ids: list[str], scopes: list[Scope]) -> list[tuple]:
    """The rows (`UNIT_COLS`) of units that belong to one of `scopes` exactly, in `unit_ids` order: the
    isolation check, on the stored columns (level, user, workspace, session) without building units."""
    allowed = {(s.level.value, s.user, s.workspace, s.session) for s in scopes}
    by_id = {r[0]: r for r in rows if (r[4], r[5], r[6], r[7]) in allowed}
    return [by_id[i] for i in unit_ids if i in by_id]


def unit_of(row: tuple) -> MemoryUnit:
    """A stored row (`UNIT_COLS`) as a unit, without re-validating it (it was validated when written; this
    is the read path of every request, where validating ~100 candidates cost milliseconds)."""
    (uid, kind, content, key, level, user, ws, sess, src, turns, c_at, u_at, conf, mentions, sup,
     sup_by) = row
    return MemoryUnit.model_construct(
        unit_id=uid, kind=Kind(kind), content=content, key=key, level=Level(level), user=user, workspace=ws,
        session=sess, source_session=src, source_turns=json.loads(turns), created_at=c_at, updated_at=u_at,
        confidence=conf, mentions=mentions, supersedes=sup, superseded_by=sup_by)


def row_of(u: MemoryUnit) -> tuple:
    """A unit as the values of `UNIT_COLS`."""
    return (u.unit_id, u.kind.value, u.content, u.key, u.level.value, u.user, u.workspace, u.session,
            u.source_session, json.dumps(u.source_turns), u.created_at, u.updated_at, u.confidence,
            u.mentions, u.supersedes, u.superseded_by)


def merged_turns(stored: str, new: list[str]) -> str:
    """A unit's source turns (JSON) after a merge: old then new, without repeats, the newest kept."""
    return json.dumps(list(dict.fromkeys([*json.loads(stored), *new]))[-MAX_SOURCE_TURNS:])


def inbox_values(e: InboxEntry) -> tuple:
    """An inbox turn as the values of `INBOX_COLS`."""
    payload = json.dumps({"user_texts": e.user_texts, "assistant_text": e.assistant_text})
    return (e.turn_id, e.session_id, e.user, e.workspace, e.cap, e.turn_index, e.created_at, int(e.last), payload)


def inbox_entry(row: tuple) -> InboxEntry:
    tid, sid, u, ws, cap, idx, c_at, last, payload = row
    p = json.loads(payload)
    return InboxEntry(tid, sid, u, ws, cap, idx, c_at, bool(last), p["user_texts"], p["assistant_text"])


def reencoded(rows: list[tuple[int, str]], encode: Callable[[list[str]], Any], batch: int) -> Iterable[tuple]:
    """(vector bytes, rid) of `rows` ((rid, content)) encoded `batch` at a time: the arguments of
    REENCODE_UPDATE."""
    for i in range(0, len(rows), batch):
        chunk = rows[i:i + batch]
        vecs = encode([content for _, content in chunk])
        yield from ((v.astype("<f4").tobytes(), rid) for v, (rid, _) in zip(vecs, chunk, strict=True))


def marks(n: int) -> str:
    return ",".join("?" * n)


def filter_sql(flt: UnitFilter) -> tuple[str, list[Any]]:
    """WHERE clause and arguments of a listing/export filter."""
    clauses, args = ["1 = 1"], []
    for col, val in (("user_id", flt.user), ("workspace_id", flt.workspace), ("session_id", flt.session),
                     ("level", flt.level), ("kind", flt.kind.value if flt.kind else None)):
        if val is not None:
            clauses.append(f"{col} = ?")
            args.append(val)
    if not flt.include_superseded:
        clauses.append("superseded_by IS NULL")
    return " AND ".join(clauses), args


@dataclass(frozen=True)
class ForgetTarget:
    """What a forget of (user[, workspace[, session]]) deletes: units, scope rows and inbox turns
    (WHERE clause, arguments), and the owner whose forget is remembered."""

    units: tuple[str, list[str]]
    scopes: tuple[str, list[str]]
    inbox: tuple[str, list[str]]
    owner: tuple[str, ...]


def forget_target(user: str, workspace: str | None = None, session: str | None = None) -> ForgetTarget:
    """A session also takes the units extracted from it into wider scopes (its `source_session`)."""
    if session is not None and workspace is None:
        raise ValueError("forgetting a session needs its workspace")
    if session is not None:
        owner = (user, workspace, session)
        return ForgetTarget(
            ("user_id = ? AND ((workspace_id = ? AND session_id = ?) OR source_session = ?)",
             [user, workspace, session, session]),
            ("scope_key = ?", [Scope(Level.session, user, workspace, session).key]),
            ("user_id = ? AND workspace_id = ? AND session_id = ?", list(owner)), owner)  # type: ignore[arg-type]
    if workspace is not None:
        where = ("user_id = ? AND workspace_id = ?", [user, workspace])
        return ForgetTarget(where, where, where, (user, workspace))
    where = ("user_id = ?", [user])
    return ForgetTarget(where, where, where, (user,))


def history_chain(get: Callable[[str], MemoryUnit | None], unit_id: str) -> list[MemoryUnit]:
    """The supersession chain through `unit_id`, oldest first (`get` reads one unit)."""
    unit = get(unit_id)
    if unit is None:
        return []
    chain, seen = [unit], {unit.unit_id}
    while chain[0].supersedes and chain[0].supersedes not in seen and (u := get(chain[0].supersedes)):
        chain.insert(0, u)
        seen.add(u.unit_id)
    while chain[-1].superseded_by and chain[-1].superseded_by not in seen and (u := get(chain[-1].superseded_by)):
        chain.append(u)
        seen.add(u.unit_id)
    return chain


def stats_of(by: Iterable[tuple[str, str, int]], superseded: int, scopes: int, users: int, pending: int,
             oldest: float | None) -> dict[str, Any]:
    """The store's stats from (kind, level, active count) rows and the other counts."""
    by = list(by)
    by_kind: dict[str, int] = {}
    by_level: dict[str, int] = {}
    for kind, level, n in by:
        by_kind[kind] = by_kind.get(kind, 0) + n
        by_level[level] = by_level.get(level, 0) + n
    return {"units": sum(by_kind.values()), "by_kind": by_kind, "by_level": by_level,
            "by_kind_level": {f"{k}/{lv}": n for k, lv, n in by}, "superseded": superseded,
            "scopes": scopes, "users": users, "inbox_pending": pending, "inbox_oldest": oldest}


def rarest_terms(df: Iterable[tuple[str, int]], max_df: int) -> list[tuple[int, str]]:
    """(doc frequency, term) of the query terms worth searching, rarest first: terms in more than `max_df`
    units of a scope are dropped (they rank nothing and their postings cost the most), and at most
    MAX_QUERY_TERMS remain, so one search reads a bounded number of postings whatever the scope size."""
    return sorted((doc, term) for term, doc in df if 0 < doc <= max_df)[:MAX_QUERY_TERMS]
