"""`UpstreamEngineImpl` against a real HTTP upstream on loopback (an aiohttp server in a thread of its own,
answering with each test's handler): what it sends, retries, error mapping without secrets, capture from
streams, Anthropic over an OpenAI upstream."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from core.config import EngineConfig, ModelConfig, UpstreamEndpoint
from serve.protocol import EngineRequestError, Reply
from serve.upstream import UpstreamEngineImpl

KEY = "sk-upstream-SECRET-42"
MSGS = [{"role": "user", "content": "hi"}]
SLOW = object()  # a handler's answer: reply only after the engine's timeout


@dataclass
class Sent:
    """What the upstream received."""

    content: bytes
    headers: dict[str, str]
    path: str


@dataclass
class Answer:
    status: int
    content: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def answer(status: int, json_body=None, content: bytes = b"") -> Answer:
    return Answer(status, json.dumps(json_body).encode() if json_body is not None else content)


class Upstream:
    """A real server on 127.0.0.1 whose every request goes to `handler(Sent) -> Answer | SLOW`."""

    def __init__(self, handler):
        self.handler, self.loop = handler, asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        async def handle(request: web.Request) -> web.StreamResponse:
            sent = Sent(await request.read(), {k.lower(): v for k, v in request.headers.items()}, request.path)
            out = self.handler(sent)
            if out is SLOW:
                await asyncio.sleep(2.0)
                out = answer(200, _reply())
            return web.Response(status=out.status, body=out.content, headers=out.headers)

        async def start() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", handle)
            self.runner = web.AppRunner(app, access_log=None)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


_servers: list[Upstream] = []


@pytest.fixture(autouse=True)
def _stop_servers():
    yield
    while _servers:
        _servers.pop().stop()


def _reply(with_ids: bool = True) -> dict:
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "yo"},
              "logprobs": {"content": [{"token": "yo", "logprob": -0.25}]}}
    body = {"id": "r", "object": "chat.completion", "created": 0, "model": "up-model", "choices": [choice],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
    if with_ids:
        body["prompt_token_ids"], choice["token_ids"] = [1, 2], [9]
    return body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine(handler, monkeypatch, base_url: str | None = None, **ep) -> UpstreamEngineImpl:
    monkeypatch.setenv("UP_KEY", KEY)
    if base_url is None:
        _servers.append(Upstream(handler))
        base_url = _servers[-1].base_url
    endpoint = UpstreamEndpoint(base_url=base_url, model="up-model", api_key_env="UP_KEY", backoff_s=0,
                                max_retries=2, **ep)
    return UpstreamEngineImpl(ModelConfig().model_dump(),
                              EngineConfig(backend="upstream", upstream=endpoint).model_dump())


def test_sends_only_the_body_the_model_and_its_own_key(monkeypatch):
    seen = []

    def handler(request: Sent) -> Answer:
        seen.append(request)
        return answer(200, _reply())

    reply = asyncio.run(_engine(handler, monkeypatch).chat({"model": "clawray-policy", "messages": MSGS}))
    (req,) = seen
    sent = json.loads(req.content)
    assert req.path == "/v1/chat/completions" and req.headers["authorization"] == f"Bearer {KEY}"
    assert not [h for h in req.headers if h.startswith("x-")]  # no clawray (or client) headers
    assert sent["model"] == "up-model" and sent["logprobs"] is True and sent["return_token_ids"] is True
    assert reply.capture.prompt_json == b"[1, 2]" and reply.capture.choices[0].logprobs == [-0.25]
    assert "prompt_token_ids" not in reply.body and reply.body["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("compact", [True, False])
def test_prompt_ids_reach_the_capture_unparsed_unless_the_client_asked_for_them(monkeypatch, compact):
    ids = list(range(100, 3100))
    body = {**_reply(), "prompt_token_ids": ids}
    content = json.dumps(body, separators=(",", ":") if compact else None).encode()
    eng = _engine(lambda request: Answer(200, content), monkeypatch)
    cap = asyncio.run(eng.chat({"messages": MSGS})).capture
    assert cap.prompt_ids == [] and json.loads(cap.prompt_bytes()) == ids and cap.prompt_count() == 3000
    asked = asyncio.run(eng.chat({"messages": MSGS, "return_token_ids": True}))
    assert asked.body["prompt_token_ids"] == ids and asked.capture.prompt_ids == ids  # parsed for the client
    anthropic = asyncio.run(eng.messages({"model": "m", "max_tokens": 8, "messages": MSGS})).capture
    assert json.loads(anthropic.prompt_bytes()) == ids


def test_a_refused_capture_field_is_dropped_and_the_request_retried(monkeypatch):
    bodies = []

    def handler(request):
        body = json.loads(request.content)
        bodies.append(body)
        if "return_token_ids" in body:
            return answer(400, {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}})
        return answer(200, _reply(with_ids=False))

    eng = _engine(handler, monkeypatch)
    reply = asyncio.run(eng.chat({"messages": MSGS}))
    assert len(bodies) == 2 and not eng.caps.token_ids and eng.caps.logprobs
    assert reply.capture.choices[0].token_ids == [] and reply.body["choices"][0]["message"]["content"] == "yo"
    asyncio.run(eng.chat({"messages": MSGS}))
    assert "return_token_ids" not in bodies[-1] and len(bodies) == 3  # remembered


@pytest.mark.parametrize("status, body, want_status, want_text", [
    (400, {"error": {"message": f"max_tokens must be positive (key {KEY})"}}, 400, "refused the request"),
    (401, {"error": {"message": f"invalid key {KEY}"}}, 502, "credentials"),
    (429, {"error": {"message": "slow down"}}, 429, "rate limiting"),
    (500, {"error": {"message": "boom"}}, 502, "HTTP 500"),
])
def test_upstream_errors_map_to_clear_client_errors_without_the_key(monkeypatch, status, body, want_status,
                                                                    want_text):
    calls = []

    def handler(request):
        calls.append(1)
        return answer(status, body)

    eng = _engine(handler, monkeypatch)
    with pytest.raises(EngineRequestError) as e:
        asyncio.run(eng.chat({"messages": MSGS}))
    assert e.value.status == want_status and want_text in e.value.message
    assert KEY not in e.value.message and eng.ep.base_url not in e.value.message and "127.0.0.1" not in e.value.message
    assert len(calls) == (3 if status in (429, 500) else 1)  # transient ones were retried


def test_unreachable_and_timeout(monkeypatch):
    refused = _engine(None, monkeypatch, base_url=f"http://127.0.0.1:{_free_port()}/v1")  # nothing listens
    slow = _engine(lambda r: SLOW, monkeypatch, timeout_s=0.3)
    for eng, status in ((refused, 502), (slow, 504)):
        with pytest.raises(EngineRequestError) as e:
            asyncio.run(eng.chat({"messages": MSGS}))
        assert e.value.status == status and "127.0.0.1" not in e.value.message


def test_a_stream_line_longer_than_any_read_buffer_is_read_whole(monkeypatch):
    # vLLM puts every prompt token id into a stream's first chunk: one SSE line of megabytes for long prompts.
    ids = list(range(300_000))
    stream = _sse(_chunk({"role": "assistant", "content": ""}, prompt_token_ids=ids),
                  _chunk({"content": "Hi"}, finish="stop", ids=[7], lp=-0.5))
    eng = _engine(lambda r: answer(200, content=stream), monkeypatch)
    events, reply = asyncio.run(_drain(eng.chat_stream({"messages": MSGS, "stream": True})))
    assert reply.capture.prompt_ids == ids and reply.capture.choices[0].token_ids == [7]


def _sse(*chunks: dict) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def _chunk(delta, finish=None, ids=None, lp=None, usage=None, choices=True, **top):
    ch = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids is not None:
        ch["token_ids"] = ids
    if lp is not None:
        ch["logprobs"] = {"content": [{"token": "t", "logprob": lp}]}
    out = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "up-model",
           "choices": [ch] if choices else [], **top}
    if usage:
        out["usage"] = usage
    return out


STREAM = _sse(_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
              _chunk({"content": "Hi"}, ids=[7], lp=-0.5),
              _chunk({"content": "!"}, finish="stop", ids=[8], lp=-1.5),
              _chunk({}, choices=False, usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}))


async def _drain(gen) -> tuple[list[str], Reply]:
    items = [x async for x in gen]
    assert isinstance(items[-1], Reply)
    return items[:-1], items[-1]


def test_stream_is_forwarded_without_added_fields_and_captured(monkeypatch):
    eng = _engine(lambda r: answer(200, content=STREAM), monkeypatch)
    events, reply = asyncio.run(_drain(eng.chat_stream({"messages": MSGS, "stream": True})))
    assert events[-1] == "data: [DONE]\n\n"
    assert all("token_ids" not in e and '"logprobs": {' not in e for e in events)
    assert "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-2]) == "Hi!"
    cap = reply.capture
    assert cap.prompt_ids == [1, 2, 3] and cap.choices[0].token_ids == [7, 8]
    assert cap.choices[0].logprobs == [-0.5, -1.5]


def test_anthropic_stream_over_an_openai_upstream(monkeypatch):
    sent = []

    def handler(request):
        sent.append(json.loads(request.content))
        return answer(200, content=STREAM)

    eng = _engine(handler, monkeypatch)
    body = {"model": "claude", "max_tokens": 5, "stream": True, "system": "terse", "messages": MSGS}
    events, reply = asyncio.run(_drain(eng.messages_stream(body)))
    kinds = [e.split("\n", 1)[0].removeprefix("event: ") for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert '"Hi"' in "".join(events) and reply.capture.choices[0].token_ids == [7, 8]
    assert reply.messages[0] == {"role": "system", "content": "terse"}
    assert sent[0]["stream_options"] == {"include_usage": True} and sent[0]["max_completion_tokens"] == 5


def test_adapters_and_count_tokens_are_refused(monkeypatch):
    eng = _engine(lambda r: answer(500), monkeypatch)
    for call in (eng.load_adapter("policy-v0001"), eng.activate("policy-v0001"), eng.unload("policy-v0001"),
                 eng.publish("policy-v0001")):
        with pytest.raises(EngineRequestError) as e:
            asyncio.run(call)
        assert e.value.status == 409 and "upstream mode" in e.value.message
    with pytest.raises(EngineRequestError) as e:
        asyncio.run(eng.count_tokens({"messages": MSGS}))
    assert e.value.status == 501
    assert asyncio.run(eng.models())["base"] == "up-model"
