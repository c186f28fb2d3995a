"""A stored turn's JSON (pure; serve/sessions.py stores it, serve/outbox.py's file sink writes it as is).

A turn's prompt ids are most of its JSON (~3,000 ids against ~1 KB of everything else once the skills
block is kept apart: serve/skill_blocks.py). The Proxy never parses them from an upstream's reply
(serve/upstream_wire.py `cut_prompt_ids`) and the store never re-serialises them: the payload is the turn
without `prompt_ids`, then the ids' JSON text appended as its last key. Pydantic reads keys in any order,
so `Turn.model_validate_json` reads both this form and the older one (every field in declaration order);
`split_prompt` finds the appended ids at the end (an older payload ends with `created_at`, never `]}`),
so a reader that only passes the JSON on (`turn_line`) parses and writes ~1 KB instead of ~20.
"""

from __future__ import annotations

import json

from pydantic_core import from_json, to_json

from core.contracts import Turn
from serve import skill_blocks

IDS_KEY = ',"prompt_ids":'


def payload_json(turn: Turn, prompt: bytes | None) -> str:
    """The stored JSON of `turn`; `prompt`: its prompt ids as a JSON array of ints, in place of its own."""
    if prompt is None:
        return turn.model_dump_json()
    head = turn.model_dump_json(exclude={"prompt_ids"})
    return f"{head[:-1]}{IDS_KEY}{prompt.decode('ascii')}}}"


def split_prompt(payload: str) -> tuple[str, str] | None:
    """(the payload without its appended prompt ids, their JSON array), or None for a payload whose ids
    are not appended last (an older one, or one without ids)."""
    if not payload.endswith("]}"):
        return None
    i = payload.rfind(IDS_KEY)
    if i < 0:
        return None
    return payload[:i] + "}", payload[i + len(IDS_KEY):-1]


def turn_line(payload: str, next_state: str | None, ended: int, idle: int, block_ref: str | None = None,
              block_at: str | None = None, texts: dict[str, str] | None = None) -> str:
    """The whole turn's JSON as serve/sessions.py's reader would give it (`Turn.model_dump_json` of it, up
    to key order and number spelling) without parsing its prompt ids: the messages whole again (the skills
    block pasted back), the next state and how the turn ended."""
    if not (block_ref or next_state is not None or ended or idle):
        return payload
    split = split_prompt(payload)
    head, ids = split if split is not None else (payload, None)
    data = from_json(head)
    if block_ref:
        data["messages"] = skill_blocks.paste(data["messages"], json.loads(block_at), (texts or {})[block_ref])
    if next_state is not None:
        data["next_state"] = json.loads(next_state)
    if ended or idle:
        data["last_in_session"] = True
    if idle:
        data["idle_flushed"] = True
    out = to_json(data).decode()
    return out if ids is None else f"{out[:-1]}{IDS_KEY}{ids}}}"
