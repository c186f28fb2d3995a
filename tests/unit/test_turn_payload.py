"""A turn's prompt ids travel as JSON text from the upstream's reply to the store and out to the turn file,
never parsed on the way (serve/turn_payload.py): every reader still gets the same turn as before."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic_core import to_json

from core.contracts import Turn
from serve.history import read_history
from serve.outbox import Dispatcher, JsonlTurnSink
from serve.sessions import SessionStore
from serve.turn_payload import payload_json, split_prompt, turn_line

IDS = [151644, 8948, 198, *range(1000, 1300), 151645]
BLOCK = "\n\n## Skills you have\n- check the calendar twice\n- confirm the new time"
SYSTEM = {"role": "system", "content": "Be brief." + BLOCK}
ODD = {"role": "user", "content": 'say "prompt_ids":[1] }]', "prompt_ids": [7], "name": "ü"}  # a client's odd keys


def _turn(sid: str, prompt_ids: list[int] | None = None, **kw) -> Turn:
    return Turn(session_id=sid, turn_index=0, prompt_ids=prompt_ids or [], response_ids=[5, 6],
                response_logprobs=[-0.25, -1e-7], **kw)


def test_payload_keeps_the_ids_text_last_and_reads_back_as_the_same_turn():
    t = _turn("s", messages=[SYSTEM, ODD], tool_calls=[{"id": "c", "prompt_ids": [3]}])
    stored = payload_json(t, to_json(IDS))
    head, ids = split_prompt(stored)
    assert json.loads(ids) == IDS and "prompt_ids" not in json.loads(head)
    assert Turn.model_validate_json(stored) == t.model_copy(update={"prompt_ids": IDS})
    old = t.model_copy(update={"prompt_ids": IDS}).model_dump_json()  # the form stored before
    assert split_prompt(old) is None and turn_line(old, None, 0, 0) == old


def _records(s: SessionStore, prompt: bytes | None) -> None:
    """Every way a stored turn gets completed: by the next turn (a next state), by ending, by the idle
    flush; with the skills block kept apart and without one."""
    own = None if prompt is not None else IDS
    first = [SYSTEM, ODD]
    s.record([_turn("cont", own, messages=first, response_text="answer")], read_history(first), BLOCK, prompt)
    later = [*first, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "and then?"}]
    s.record([_turn("cont", own, messages=later, last_in_session=True)], read_history(later), BLOCK, prompt)
    s.record([_turn("plain", own, messages=[ODD], last_in_session=True)], None, "", prompt)
    s.record([_turn("idle", own, messages=[SYSTEM])], read_history([SYSTEM]), BLOCK, prompt)
    s.flush_idle(idle_s=-1)


@pytest.mark.parametrize("prompt", [to_json(IDS), None], ids=["ids-as-text", "ids-in-the-turn"])
def test_claimed_lines_are_the_claimed_turns(tmp_path, state_cfg, prompt):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    _records(s, prompt)
    turns = {t.turn_id: t for t in s.claim(10, 60)}
    s.release(list(turns), retry_in_s=0)
    lines = s.claim_lines(10, 60)
    assert len(turns) == len(lines) == 4
    for line in lines:
        back = Turn.model_validate_json(line.json)
        assert back == turns[line.turn_id] and back.prompt_ids == IDS
    kinds = {(t.session_id, t.last_in_session, t.idle_flushed, t.next_state is not None) for t in turns.values()}
    assert kinds == {("cont", False, False, True), ("cont", True, False, False), ("plain", True, False, False),
                     ("idle", True, True, False)}
    assert all(t.messages[0] == SYSTEM for t in turns.values() if t.session_id != "plain")  # block pasted back
    (continued,) = [t for t in turns.values() if t.next_state is not None]
    assert continued.next_state == [{"role": "user", "content": "and then?"}] and continued.messages == [SYSTEM, ODD]


def test_the_turn_file_gets_the_stored_turns_through_the_dispatcher(tmp_path, state_cfg):
    s = SessionStore(tmp_path / "s.db", state_cfg)
    _records(s, to_json(IDS))
    path = tmp_path / "completed.jsonl"
    assert asyncio.run(Dispatcher(s, JsonlTurnSink(path), idle_s=3600).drain_once()) == 4
    written = [Turn.model_validate_json(line) for line in path.read_text().splitlines()]
    assert sorted(t.turn_id for t in written) == sorted(t.turn_id for t in s.turns())
    assert {t.turn_id: t for t in written} == {t.turn_id: t for t in s.turns()}
