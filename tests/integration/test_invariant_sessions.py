"""Invariant (issue 12 item 4) through the real Proxy and engine: a next state belongs to its turn.

Parallel, retried and interleaved requests on ONE session id (the session-scoped system of conftest.py);
every stored turn is identified by the question it answered (its last user message) and must carry, as
its next state, exactly what followed its own reply in its own conversation.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import openai
import pytest

from tests.integration.helpers import session_turns

pytestmark = pytest.mark.slow
MAX_TOKENS = 4


def _sid() -> str:
    return f"inv-{uuid.uuid4().hex[:10]}"


def _client(serve_app, sid: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=serve_app["base_url"] + "/v1", api_key="unused", max_retries=0,
                              timeout=120, default_headers={"X-Session-Id": sid})


async def _ask(client: openai.AsyncOpenAI, messages: list[dict], stream: bool = False) -> str:
    """One request; returns the reply text as the client got it (streamed or not)."""
    if not stream:
        r = await client.chat.completions.create(model="clawray-policy", messages=messages, max_tokens=MAX_TOKENS)
        return r.choices[0].message.content or ""
    chunks = await client.chat.completions.create(model="clawray-policy", messages=messages,
                                                  max_tokens=MAX_TOKENS, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


async def _converse(client: openai.AsyncOpenAI, name: str, steps: int) -> list[str]:
    """One conversation of `steps` user messages, each sent with the whole history (odd steps stream)."""
    history: list[dict] = []
    questions = [f"[{name}] question {i}" for i in range(steps)]
    for i, q in enumerate(questions):
        history.append({"role": "user", "content": q})
        history.append({"role": "assistant", "content": await _ask(client, history, stream=i % 2 == 1)})
    return questions


def _expected(conversations: list[list[str]]) -> dict[str, list[dict] | None]:
    """question -> the next state its turn must carry: the conversation's next question, or None."""
    out: dict[str, list[dict] | None] = {}
    for qs in conversations:
        for i, q in enumerate(qs):
            out[q] = [{"role": "user", "content": qs[i + 1]}] if i + 1 < len(qs) else None
    return out


def _by_question(serve_app, sid: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in session_turns(Path(serve_app["config"].storage_path()), sid):
        question = [m["content"] for m in t.messages if m.get("role") == "user"][-1]
        out.setdefault(question, []).append(t)
    return out


def test_parallel_conversations_under_one_session_id_keep_their_own_next_states(serve_app):
    sid = _sid()

    async def run():
        client = _client(serve_app, sid)
        try:
            return await asyncio.gather(*(_converse(client, name, 3) for name in ("ana", "bo", "cy")))
        finally:
            await client.close()

    conversations = asyncio.run(run())
    turns = _by_question(serve_app, sid)
    expected = _expected(conversations)
    assert sorted(turns) == sorted(expected)
    for question, want in expected.items():
        (turn,) = turns[question]
        assert turn.next_state == want, (question, turn.next_state)
    indexes = sorted(t.turn_index for ts in turns.values() for t in ts)
    assert indexes == list(range(9))


def test_interleaved_conversations_and_client_retries_shift_no_feedback(serve_app):
    sid = _sid()

    async def run():
        client = _client(serve_app, sid)
        try:
            x = [{"role": "user", "content": "[x] plan the trip"}]
            y = [{"role": "user", "content": "[y] fix the bug"}]
            x.append({"role": "assistant", "content": await _ask(client, x)})
            y.append({"role": "assistant", "content": await _ask(client, y, stream=True)})
            x.append({"role": "user", "content": "[x] and hotels?"})
            await _ask(client, x)  # the client times out on this one ...
            x.append({"role": "assistant", "content": await _ask(client, x)})  # ... and retries it
            # A request and its retry in flight at once (the same body): either reply may be the one kept.
            y.append({"role": "user", "content": "[y] it still fails"})
            replies = await asyncio.gather(_ask(client, y, stream=True), _ask(client, y, stream=True))
            return x, y, replies
        finally:
            await client.close()

    x, y, replies = asyncio.run(run())
    turns = _by_question(serve_app, sid)
    assert {q: len(ts) for q, ts in turns.items()} == {
        "[x] plan the trip": 1, "[y] fix the bug": 1, "[x] and hotels?": 1, "[y] it still fails": 1}
    assert turns["[x] plan the trip"][0].next_state == [x[2]]
    assert turns["[y] fix the bug"][0].next_state == [y[2]]
    (hotels,) = turns["[x] and hotels?"]
    assert hotels.response_text == x[3]["content"] and hotels.next_state is None  # the retry's reply is kept
    (fails,) = turns["[y] it still fails"]
    assert fails.response_text in replies and fails.next_state is None
    assert sorted(t.turn_index for ts in turns.values() for t in ts) == [0, 1, 2, 3]

    async def follow_up():
        client = _client(serve_app, sid)
        try:  # y continues from the reply that was kept; x's retried turn is continued too
            await _ask(client, y + [{"role": "assistant", "content": fails.response_text},
                                    {"role": "user", "content": "[y] thanks"}])
            await _ask(client, x + [{"role": "user", "content": "[x] book it"}])
        finally:
            await client.close()

    asyncio.run(follow_up())
    turns = _by_question(serve_app, sid)
    assert turns["[y] it still fails"][0].next_state == [{"role": "user", "content": "[y] thanks"}]
    assert turns["[x] and hotels?"][0].next_state == [{"role": "user", "content": "[x] book it"}]
    assert turns["[x] plan the trip"][0].next_state == [x[2]]  # unchanged by every later request
