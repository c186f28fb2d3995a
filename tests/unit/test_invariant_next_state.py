"""Invariant (issue 12 item 4): a next state belongs to its turn.

The Proxy's real request path (ProxyImpl: meta, capture -> Turn, group commit, SQLite session store) runs
in-process over a scripted engine, so every interleaving is chosen by the test: two conversations under
one session id, a client retry, a stream whose turn was never stored, n > 1 choices, tool calls in both
protocols. Each test reads back every turn's next state.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.requests import Request

from serve.capture import Capture, ChoiceCapture
from serve.local_handle import LocalHandle
from serve.protocol import Reply
from serve.proxy import ProxyImpl


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, calls: list[dict] | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def call(name: str, args: str) -> dict[str, Any]:
    return {"id": f"call-{name}", "type": "function", "function": {"name": name, "arguments": args}}


class ScriptedEngine:
    """Replies with the texts (or tool calls) queued for the next request, in order."""

    def __init__(self) -> None:
        self.script: list[list[dict[str, Any]]] = []  # per request: one {"text", "calls"} per choice

    def say(self, *choices: str | dict[str, Any]) -> ScriptedEngine:
        self.script.append([c if isinstance(c, dict) else {"text": c, "calls": []} for c in choices])
        return self

    def _reply(self, body: dict[str, Any], anthropic: bool) -> Reply:
        choices = self.script.pop(0)
        cap = Capture(key="k", prompt_ids=[1, 2, 3], done=True)
        for i, c in enumerate(choices):
            cap.choices[i] = ChoiceCapture(i, [10 + i, 11], [-0.5, -0.5], c["text"], "stop")
        if anthropic:
            blocks = [{"type": "text", "text": choices[0]["text"]}] + [
                {"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                 "input": json.loads(tc["function"]["arguments"])} for tc in choices[0]["calls"]]
            out = {"type": "message", "role": "assistant", "content": blocks}
        else:
            out = {"choices": [{"index": i, "finish_reason": "stop", "message": assistant(c["text"], c["calls"])}
                               for i, c in enumerate(choices)]}
        return Reply(out, cap, body["messages"])

    async def chat(self, body: dict[str, Any]) -> Reply:
        return self._reply(body, anthropic=False)

    async def messages(self, body: dict[str, Any]) -> Reply:
        return self._reply(body, anthropic=True)

    async def chat_stream(self, body: dict[str, Any]):
        reply = self._reply(body, anthropic=False)
        for c in reply.body["choices"]:
            delta = {"choices": [{"index": c["index"], "delta": {"content": c["message"]["content"]}}]}
            yield f"data: {json.dumps(delta)}\n\n"
        yield "data: [DONE]\n\n"
        yield Reply({}, reply.capture, reply.messages)


def _request(body: dict[str, Any], sid: str) -> Request:
    data = [json.dumps(body).encode()]

    async def receive():
        return {"type": "http.request", "body": data.pop(0) if data else b"", "more_body": False}

    headers = [(b"x-session-id", sid.encode()), (b"content-type", b"application/json")]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


@pytest.fixture
def proxy(tmp_path):
    engine = ScriptedEngine()
    impl = ProxyImpl(LocalHandle(engine), {}, {"enabled": False}, str(tmp_path))
    impl._started = True  # no background dispatcher: the test reads the store as the requests left it
    impl.script = engine
    yield impl
    impl.store.close()


def send(proxy: ProxyImpl, sid: str, messages: list[dict], anthropic: bool = False, **extra: Any):
    body = {"model": "m", "messages": messages, **extra}
    if anthropic:
        body["max_tokens"] = 8
    response = asyncio.run(proxy.generate(_request(body, sid), anthropic=anthropic))
    assert response.status_code == 200, response.body
    return response


def turns(proxy: ProxyImpl, sid: str) -> list:
    return proxy.store.turns(sid)


def by_reply(proxy: ProxyImpl, sid: str) -> dict[str, Any]:
    return {t.response_text: t for t in turns(proxy, sid)}


def test_two_conversations_under_one_session_id_never_feed_each_other(proxy):
    s = proxy.script
    s.say("x-one").say("y-one").say("x-two").say("y-two")
    x, y = [user("plan the trip")], [user("fix the bug")]
    send(proxy, "shared", x)
    send(proxy, "shared", y)
    send(proxy, "shared", x + [assistant("x-one"), user("x: and hotels?")])
    send(proxy, "shared", y + [assistant("y-one"), user("y: it still fails")])
    got = by_reply(proxy, "shared")
    assert got["x-one"].next_state == [user("x: and hotels?")]
    assert got["y-one"].next_state == [user("y: it still fails")]
    assert got["x-two"].next_state is None and got["y-two"].next_state is None  # each waits for its own


def test_a_client_retry_creates_no_second_turn_and_shifts_no_feedback(proxy):
    s = proxy.script
    s.say("first").say("second").say("second, retried").say("third")
    r1 = [user("u1")]
    r2 = r1 + [assistant("first"), user("u2")]
    send(proxy, "s", r1)
    send(proxy, "s", r2)
    send(proxy, "s", r2)  # the client timed out and sent the same request again
    ts = turns(proxy, "s")
    assert [(t.turn_index, t.response_text) for t in ts] == [(0, "first"), (1, "second, retried")]
    assert ts[0].next_state == [user("u2")] and ts[1].next_state is None
    send(proxy, "s", r2 + [assistant("second, retried"), user("u3")])  # continues from the reply it got
    got = by_reply(proxy, "s")
    assert got["second, retried"].next_state == [user("u3")] and got["first"].next_state == [user("u2")]
    assert sorted(t.turn_index for t in turns(proxy, "s")) == [0, 1, 2]


def test_the_same_conversation_with_other_parameters_is_not_a_retry(proxy):
    proxy.script.say("short").say("longer one")
    send(proxy, "s", [user("u1")], max_tokens=2)
    send(proxy, "s", [user("u1")], max_tokens=20)
    assert [(t.turn_index, t.response_text) for t in turns(proxy, "s")] == [(0, "short"), (1, "longer one")]


def test_a_stream_whose_turn_was_never_stored_hands_no_later_feedback_to_the_previous_turn(proxy):
    s = proxy.script
    s.say("A1").say("A2").say("A3")
    r1 = [user("u1")]
    send(proxy, "s", r1)
    r2 = r1 + [assistant("A1"), user("u2")]
    response = send(proxy, "s", r2, stream=True)

    async def read_content_then_die():
        it = response.body_iterator
        assert "A2" in await it.__anext__()  # the client has the content ...
        await it.aclose()  # ... and the replica dies before the turn is stored

    asyncio.run(read_content_then_die())
    assert [t.response_text for t in turns(proxy, "s")] == ["A1"]
    send(proxy, "s", r2 + [assistant("A2"), user("u3")])
    got = by_reply(proxy, "s")
    assert got["A1"].next_state == [user("u2")]  # not u3: that followed A2, whose turn was lost


def test_continuing_one_of_n_choices_completes_its_siblings_without_a_next_state(proxy):
    s = proxy.script
    s.say("alpha", "beta").say("next")
    send(proxy, "s", [user("u1")], n=2)
    send(proxy, "s", [user("u1"), assistant("beta"), user("u2 about beta")])
    got = by_reply(proxy, "s")
    assert got["beta"].next_state == [user("u2 about beta")]
    assert got["alpha"].next_state is None and not got["alpha"].last_in_session
    completed = {t.turn_id for t in proxy.store.turns("s", state="completed")}
    assert {got["alpha"].turn_id, got["beta"].turn_id} <= completed  # the group goes to scoring whole
    assert got["next"].turn_id not in completed


def test_tool_calls_are_matched_by_name_and_normalised_arguments(proxy):
    s = proxy.script
    s.say({"text": "", "calls": [call("weather", '{"city": "Oslo", "unit": "c"}')]})
    s.say({"text": "", "calls": [call("weather", '{"city": "Bergen", "unit": "c"}')]})
    s.say("done")
    send(proxy, "s", [user("weather in Oslo?")], tools=[{"type": "function", "function": {"name": "weather"}}])
    send(proxy, "s", [user("weather in Bergen?")], tools=[{"type": "function", "function": {"name": "weather"}}])
    echoed = assistant(None, [call("weather", '{"unit":"c",  "city":"Oslo"}')])  # reformatted by the client
    result = {"role": "tool", "tool_call_id": "call-weather", "content": "12 degrees"}
    send(proxy, "s", [user("weather in Oslo?"), echoed, result])
    oslo, bergen, _ = sorted(turns(proxy, "s"), key=lambda t: t.turn_index)
    assert oslo.next_state == [result] and bergen.next_state is None


def test_anthropic_tool_use_is_matched_and_its_tool_result_is_the_next_state(proxy):
    s = proxy.script
    s.say({"text": "let me look", "calls": [call("weather", '{"city": "Oslo"}')]}).say("12 degrees it is")
    send(proxy, "s", [user("weather in Oslo?")], anthropic=True)
    use = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12"}]}
    send(proxy, "s", [user("weather in Oslo?"), {"role": "assistant", "content": [use]}, result], anthropic=True)
    first, _ = turns(proxy, "s")
    assert first.next_state == [result]


def test_a_sliding_window_of_the_conversation_still_completes_each_turn(proxy):
    s = proxy.script
    s.say("a0").say("a1").say("a2")
    send(proxy, "s", [user("u0")])
    send(proxy, "s", [user("u0"), assistant("a0"), user("u1")])
    send(proxy, "s", [user("u1"), assistant("a1"), user("u2")])  # the client keeps the last 3 messages
    t0, t1, _ = turns(proxy, "s")
    assert t0.next_state == [user("u1")] and t1.next_state == [user("u2")]


def test_a_request_and_its_retry_committed_in_one_batch_leave_one_turn(tmp_path, state_cfg):
    from core.contracts import Turn
    from serve.history import read_history
    from serve.sessions import SessionStore

    store = SessionStore(tmp_path / "s.db", state_cfg)
    h = read_history([user("u1")], b"params")

    def turn(text):
        return [Turn(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                     response_text=text)]

    store.record_batch([(turn("original"), h), (turn("retry"), h)])  # one group commit, in arrival order
    assert [(t.turn_index, t.response_text) for t in store.turns("s")] == [(0, "retry")]
    store.close()
