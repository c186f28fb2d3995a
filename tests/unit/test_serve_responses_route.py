"""The Proxy's request path for `POST /v1/responses` and for requests real agents send (issue 16 items 2
and 3), in-process over a fake engine (ProxyImpl, LocalHandle, the SQLite session store): capture, skill
injection into `instructions`, session identity, side turns, the recorded output-token limit, and clear
400s in each API's error shape that change nothing. tests/integration/test_serve_responses.py runs the
same path against real vLLM with the openai SDK."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from starlette.requests import Request

from serve.apis import CHAT, MESSAGES, RESPONSES
from serve.capture import Capture, ChoiceCapture
from serve.injection import add_to_system
from serve.local_handle import LocalHandle
from serve.protocol import Reply
from serve.proxy import ProxyImpl

CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
        "arguments": '{"unit": "c"}', "status": "completed"}
GRANTED = 1900  # what the fake engine says it ran with (vLLM: the context left after the prompt)


def _capture() -> Capture:
    cap = Capture(key="k", prompt_ids=[1, 2, 3], done=True, max_tokens=GRANTED)
    cap.choices[0] = ChoiceCapture(0, [10, 11], [-0.5, -0.25], "<tool_call>...</tool_call>", "stop")
    return cap


class FakeEngine:
    """Records each body it is sent; answers every API with one function call."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def _got(self, api: str, body: dict[str, Any]) -> None:
        self.bodies.append((api, copy.deepcopy(body)))

    async def chat(self, body: dict[str, Any]) -> Reply:
        self._got("chat", body)
        return Reply({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]},
                     _capture(), body["messages"])

    async def messages(self, body: dict[str, Any]) -> Reply:
        self._got("messages", body)
        return Reply({"type": "message", "content": [{"type": "text", "text": "ok"}]}, _capture(),
                     body["messages"])

    def _rendered(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": body.get("instructions") or ""}, {"role": "user", "content": "x"}]

    async def responses(self, body: dict[str, Any]) -> Reply:
        self._got("responses", body)
        return Reply({"id": "resp_1", "object": "response", "output": [CALL]}, _capture(), self._rendered(body))

    async def responses_stream(self, body: dict[str, Any]):
        self._got("responses", body)
        yield 'event: response.created\ndata: {"type": "response.created"}\n\n'
        completed = {"type": "response.completed", "response": {"id": "resp_1", "output": [CALL]}}
        yield f"event: response.completed\ndata: {json.dumps(completed)}\n\n"
        yield Reply({}, _capture(), self._rendered(body))


class FakeInjector:
    """Injects one skill block, as the skills plane's injector does (serve/injection.py)."""

    async def inject_block(self, body: dict[str, Any], anthropic: bool, fits=None,
                           tenant=None, query=None) -> tuple[list[str], int, str]:
        add_to_system(body, "SKILL: say the unit", anthropic)
        return ["units"], 4, "SKILL: say the unit"


def _request(body: dict[str, Any], **headers: str) -> Request:
    data = [json.dumps(body).encode()]

    async def receive():
        return {"type": "http.request", "body": data.pop(0) if data else b"", "more_body": False}

    raw = [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw}, receive)


@pytest.fixture
def proxy(tmp_path):
    impl = ProxyImpl(LocalHandle(FakeEngine()), {}, {"enabled": False}, str(tmp_path))
    impl._started = True  # no background dispatcher: the test reads the store as the requests left it
    impl.injector = FakeInjector()
    yield impl
    impl.store.close()


def _send(proxy: ProxyImpl, api, body: dict[str, Any], **headers: str):
    return asyncio.run(proxy.handle(_request(body, **headers), api))


ASK = {"model": "clawray-policy", "instructions": "Be terse.", "max_output_tokens": 32000,
       "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
       "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}]}


def test_a_responses_turn_is_captured_with_its_tool_call_and_skills_in_the_instructions(proxy):
    response = _send(proxy, RESPONSES, ASK, x_session_id="r1")
    assert response.status_code == 200 and json.loads(response.body)["output"] == [CALL]
    (api, sent), = proxy.engine._target.bodies
    assert api == "responses" and sent["instructions"] == "Be terse.\n\nSKILL: say the unit"
    (turn,) = proxy.store.turns("r1")
    assert turn.tool_calls == [{"id": "call_1", "function": {"name": "get_weather", "arguments": '{"unit": "c"}'}}]
    assert turn.skills == ["units"] and turn.skill_generation == 4
    assert turn.prompt_ids == [1, 2, 3] and turn.response_ids == [10, 11] and turn.response_logprobs == [-0.5, -0.25]
    assert turn.messages[0] == {"role": "system", "content": "Be terse.\n\nSKILL: say the unit"}
    assert (turn.max_tokens_requested, turn.max_tokens_granted) == (32000, GRANTED)


def test_a_responses_stream_holds_its_completed_event_until_the_turn_is_recorded(proxy):
    async def run() -> list[str]:
        response = await proxy.handle(_request({**ASK, "stream": True}, x_session_id="r2"), RESPONSES)
        seen = []
        async for event in response.body_iterator:
            if event.startswith("event: response.completed"):
                assert proxy.store.turns("r2"), "the completed event went out before the turn was stored"
            seen.append(event)
        return seen

    events = asyncio.run(run())
    assert [e.split("\n")[0] for e in events] == ["event: response.created", "event: response.completed"]
    (turn,) = proxy.store.turns("r2")
    assert turn.tool_calls[0]["function"]["name"] == "get_weather"


def test_a_side_responses_turn_is_served_but_neither_injected_nor_stored(proxy):
    response = _send(proxy, RESPONSES, ASK, x_session_id="r3", x_turn_type="side")
    assert response.status_code == 200
    assert proxy.engine._target.bodies[0][1]["instructions"] == "Be terse."
    assert proxy.store.turns("r3") == []


def test_header_less_responses_clients_get_one_session_per_conversation(proxy):
    first = _send(proxy, RESPONSES, ASK).headers["x-session-id"]
    follow = {**ASK, "input": ASK["input"] + [CALL, {"type": "function_call_output", "call_id": "call_1",
                                                       "output": "12C"}]}
    assert _send(proxy, RESPONSES, follow).headers["x-session-id"] == first
    other = {**ASK, "input": [{"role": "user", "content": "Write a poem."}]}
    assert _send(proxy, RESPONSES, other).headers["x-session-id"] != first
    assert first.startswith("derived-")


def test_output_limits_above_the_context_reach_the_engine_and_the_turn_records_asked_and_granted(proxy):
    chat = {"model": "m", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
    assert _send(proxy, CHAT, chat, x_session_id="c1").status_code == 200
    assert _send(proxy, MESSAGES, chat, x_session_id="m1").status_code == 200
    for sid in ("c1", "m1"):
        (turn,) = proxy.store.turns(sid)
        assert (turn.max_tokens_requested, turn.max_tokens_granted) == (32000, GRANTED)
    asked = {**chat, "max_completion_tokens": 500}
    assert _send(proxy, CHAT, asked, x_session_id="c2").status_code == 200
    assert proxy.store.turns("c2")[0].max_tokens_requested == 500  # the field the engine reads first


@pytest.mark.parametrize(("api", "body", "shape", "says"), [
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, "openai", "messages[0].role: invalid value"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "openai",
     "messages[0].content[0].type: invalid value 'hologram'"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
     "anthropic", "messages.0.content[0].type: invalid value 'hologram'"),
    (RESPONSES, {"input": [{"type": "hologram"}]}, "openai", "input[0].type: invalid value 'hologram'"),
    (RESPONSES, {"input": "more", "previous_response_id": "resp_1"}, "openai",
     "previous_response_id is not supported"),
])
def test_unknown_roles_parts_and_items_are_a_400_in_the_apis_shape_and_change_nothing(proxy, api, body, shape,
                                                                                       says):
    response = _send(proxy, api, body, x_session_id="bad")
    assert response.status_code == 400
    data = json.loads(response.body)
    if shape == "anthropic":
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    else:
        assert data["error"]["type"] == "invalid_request_error" and data["error"]["code"] == 400
    assert data["error"]["message"].startswith(says)
    assert proxy.engine._target.bodies == [] and proxy.store.turns("bad") == []


def test_upstream_mode_answers_responses_with_a_clear_501(tmp_path):
    from core.config import EngineConfig, LLMEndpoint, ModelConfig
    from serve.upstream import UpstreamEngineImpl

    endpoint = LLMEndpoint(base_url="http://upstream.invalid/v1", model="up-model")
    engine = UpstreamEngineImpl(ModelConfig().model_dump(),
                                EngineConfig(backend="upstream", upstream=endpoint).model_dump())
    impl = ProxyImpl(LocalHandle(engine), {}, {"enabled": False}, str(tmp_path))
    impl._started = True
    try:
        for body in (ASK, {**ASK, "stream": True}):
            response = _send(impl, RESPONSES, body, x_session_id="up")
            error = json.loads(response.body)["error"]
            assert response.status_code == 501 and "not available in upstream mode" in error["message"]
        assert impl.store.turns("up") == []
    finally:
        impl.store.close()
