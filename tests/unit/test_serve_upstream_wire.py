"""Upstream mode's pure part: what is added, captured and stripped; error messages; Anthropic translation."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve.protocol import EngineRequestError
from serve.upstream_wire import (
    Asked,
    Caps,
    StreamCapture,
    anthropic_events,
    anthropic_to_openai,
    capture_body,
    cut_prompt_ids,
    error_message,
    openai_to_anthropic,
    sse_data,
    strip_body,
    strip_chunk,
    top_level_cut,
    upstream_payload,
)

MSGS = [{"role": "user", "content": "hi"}]


def _body(with_ids=True):
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hey you"},
              "logprobs": {"content": [{"token": "hey", "logprob": -0.5}, {"token": " you", "logprob": -1.5}]}}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "up", "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    if with_ids:
        body["prompt_token_ids"] = [1, 2, 3]
        choice["token_ids"] = [7, 8]
    return body


def test_payload_asks_for_capture_fields_only_when_the_client_did_not():
    p, asked = upstream_payload({"model": "clawray-policy", "messages": MSGS}, "up-model", Caps())
    assert p["model"] == "up-model" and p["logprobs"] is True and p["return_token_ids"] is True
    assert asked == Asked(False, False)
    p, asked = upstream_payload({"messages": MSGS, "logprobs": True, "top_logprobs": 2}, "m",
                                Caps(token_ids=False))
    assert asked.logprobs and p["top_logprobs"] == 2 and "return_token_ids" not in p


def test_capture_keeps_ids_and_logprobs_only_one_to_one():
    cap = capture_body(_body())
    c = cap.choices[0]
    assert cap.prompt_ids == [1, 2, 3] and c.token_ids == [7, 8] and c.logprobs == [-0.5, -1.5]
    assert c.text == "hey you" and c.finish_reason == "stop"
    c = capture_body(_body(with_ids=False)).choices[0]  # a non-vLLM upstream: text only
    assert c.token_ids == [] and c.logprobs == [] and c.text == "hey you"


def test_client_sees_only_what_it_asked_for():
    out = strip_body(_body(), Asked(False, False))
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["choices"][0]["logprobs"] is None
    kept = strip_body(_body(), Asked(True, True))
    assert kept["prompt_token_ids"] == [1, 2, 3] and kept["choices"][0]["logprobs"]["content"]


def test_stream_capture_and_strip():
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2]},
        {"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [5],
                      "logprobs": {"content": [{"token": "a", "logprob": -1.0}]}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}, "token_ids": [6], "finish_reason": "length",
                      "logprobs": {"content": [{"token": "b", "logprob": -2.0}]}}]},
    ]
    acc = StreamCapture()
    for ch in chunks:
        acc.feed(ch)
    cap = acc.capture()
    assert cap.prompt_ids == [1, 2] and cap.choices[0].token_ids == [5, 6]
    assert cap.choices[0].logprobs == [-1.0, -2.0] and cap.choices[0].text == "ab"
    assert cap.choices[0].finish_reason == "length"
    assert strip_chunk(chunks[1], Asked(False, False)) and chunks[1]["choices"][0]["logprobs"] is None
    assert "token_ids" not in chunks[1]["choices"][0]
    assert not strip_chunk({"choices": [{"index": 0, "delta": {}}]}, Asked(False, False))


def test_sse_data_joins_multiline_events_and_skips_comments():
    async def lines():
        for line in [": ping", "data: {\"a\":", "data: 1}", "", "event: x", "data: [DONE]", ""]:
            yield line

    async def collect():
        return [d async for d in sse_data(lines())]

    assert asyncio.run(collect()) == ['{"a":\n1}', "[DONE]"]


def test_error_message_is_one_capped_line_without_secrets():
    text = json.dumps({"error": {"message": "bad key sk-SECRET123\n in request " + "x" * 500}})
    msg = error_message(text, ["sk-SECRET123"])
    assert "sk-SECRET123" not in msg and "***" in msg and "\n" not in msg and len(msg) <= 300
    assert error_message("<html>oops</html>", []) == "<html>oops</html>"


def test_caps_drop_only_fields_clawray_added():
    caps = Caps()
    assert caps.refused("Unrecognized request argument supplied: return_token_ids", Asked(False, False))
    assert not caps.token_ids and caps.logprobs
    assert not caps.refused("logprobs are not supported", Asked(True, False))  # the client's own field
    assert caps.logprobs


# ---- Anthropic over an OpenAI upstream (vLLM's converters, no engine) -----------------------------------

TOOLS = [{"name": "get_weather", "description": "weather",
          "input_schema": {"type": "object", "properties": {"unit": {"type": "string"}}}}]


def test_anthropic_request_becomes_standard_openai_chat():
    body = {"model": "claude", "max_tokens": 20, "system": [{"type": "text", "text": "be terse"}],
            "top_k": 5, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                   "input": {"unit": "c"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
            ]}
    payload, messages = anthropic_to_openai(body)
    assert "top_k" not in payload and payload["max_completion_tokens"] == 20
    assert payload["tool_choice"]["function"]["name"] == "get_weather"
    assert payload["tools"][0]["function"]["name"] == "get_weather"
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[3]["tool_call_id"] == "t1"
    with pytest.raises(EngineRequestError) as e:
        anthropic_to_openai({"model": "m", "messages": MSGS})  # max_tokens is required
    assert e.value.status == 400


def test_openai_reply_becomes_anthropic_message_with_tool_use():
    body = _body()
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"unit": "c"}'}}]
    out = openai_to_anthropic(body)
    assert out["type"] == "message" and out["stop_reason"] == "tool_use"
    kinds = [b["type"] for b in out["content"]]
    assert kinds == ["text", "tool_use"] and out["content"][1]["input"] == {"unit": "c"}


def test_openai_stream_becomes_anthropic_events():
    def chunk(delta, finish=None, usage=None, choices=True):
        c = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "up",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
        if usage:
            c["usage"] = usage
        return f"data: {json.dumps(c)}\n\n"

    async def sse():
        yield chunk({"role": "assistant", "content": ""})
        yield chunk({"content": "Hel"})
        yield chunk({"content": "lo"}, finish="stop")
        yield chunk({}, usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, choices=False)
        yield "data: [DONE]\n\n"

    async def collect():
        return [e async for e in anthropic_events(sse())]

    events = asyncio.run(collect())
    kinds = [e.split("\n", 1)[0].removeprefix("event: ") for e in events]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert '"end_turn"' in events[-2]


def _cut(body: dict, **dumps) -> tuple[dict, bytes] | None:
    cut = cut_prompt_ids(json.dumps(body, **dumps).encode())
    if cut is None:
        return None
    data = json.loads(cut[0])
    return (data, cut[1]) if top_level_cut(data) else None


@pytest.mark.parametrize("dumps", [{"separators": (",", ":")}, {}])
def test_prompt_ids_are_cut_out_of_a_reply_unparsed(dumps):
    data, ids = _cut(_body(), **dumps)
    assert json.loads(ids) == [1, 2, 3] and data["prompt_token_ids"] is None
    assert data["choices"] == _body()["choices"]  # the rest is untouched
    cap = capture_body(data, ids)
    assert cap.prompt_ids == [] and json.loads(cap.prompt_bytes()) == [1, 2, 3] and cap.prompt_count() == 3


def test_the_name_inside_text_is_escaped_and_never_cut():
    body = _body()
    body["choices"][0]["message"]["content"] = 'say "prompt_token_ids":[9] please'
    data, ids = _cut(body, separators=(",", ":"))
    assert json.loads(ids) == [1, 2, 3] and data["choices"] == body["choices"]


@pytest.mark.parametrize("change", [
    # text ending in the quoted name: its closing quote is unescaped, so the name occurs twice
    lambda b: b["choices"][0]["message"].update(content='x"prompt_token_ids'),
    # a nested key of the same name, with or without the top-level one
    lambda b: b["choices"][0].update(prompt_token_ids=[4, 5]),
    lambda b: (b.pop("prompt_token_ids"), b["choices"][0].update(prompt_token_ids=[4, 5])),
    lambda b: b.update(prompt_token_ids=[1.5, 2]),  # not token ids
    lambda b: b.update(prompt_token_ids=[-1, 2]),
    lambda b: b.update(prompt_token_ids=None),
    lambda b: b.pop("prompt_token_ids"),
])
def test_a_reply_whose_prompt_ids_are_not_plainly_one_top_level_array_is_parsed_whole(change):
    body = _body()
    change(body)
    assert _cut(body) is None
    cap = capture_body(body)
    assert cap.prompt_json is None and cap.prompt_ids == (body.get("prompt_token_ids") or [])


def test_pretty_printed_ids_are_parsed_whole_so_no_line_break_reaches_the_turn_file():
    assert _cut(_body(), indent=2) is None
