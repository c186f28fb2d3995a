"""OpenAI Responses (`POST /v1/responses`) and the requests real agents send (issue 16 items 2 and 3),
through the Proxy with the official SDKs against real vLLM on CPU, and what each leaves in the session
store: a function tool call and its result (streaming and not) captured token-exact and linked as the
turn's next state; output-token limits far above the context (Claude Code asks 32,000; the context is
2,048) served and recorded as asked and granted; clear 400s for what the APIs refuse.

As in test_serve_protocols.py, forced tool calls use vLLM's guided decoding (a named tool choice with a
`strict` tool) plus a logit bias against whitespace-only tokens, which a random-weight model otherwise
produces endlessly inside JSON.
"""

from __future__ import annotations

import json
import uuid

import anthropic
import openai
import pytest

from tests.integration.helpers import app_turns

pytestmark = pytest.mark.slow

UNIT = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["unit"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather", "strict": True,
        "parameters": UNIT}
NAMED = {"type": "function", "name": "get_weather"}


def _sid() -> str:
    return f"r-{uuid.uuid4().hex[:10]}"


def _call(response):
    (call,) = [item for item in response.output if item.type == "function_call"]
    return call


def test_a_function_call_is_captured_token_exact_and_its_result_completes_the_turn(openai_client, serve_app,
                                                                                  tok, no_spaces):
    sid = _sid()
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = openai_client.responses.create(
        model="clawray-policy", instructions="You are terse.", input=ask, tools=[TOOL], tool_choice=NAMED,
        max_output_tokens=120, extra_body={"logit_bias": no_spaces}, extra_headers={"X-Session-Id": sid})
    call = _call(r)
    assert r.status == "completed" and call.name == "get_weather" and json.loads(call.arguments)["unit"] in "cf"
    (turn,) = app_turns(serve_app, sid)
    assert turn.tool_calls == [{"id": call.call_id, "function": {"name": "get_weather", "arguments": call.arguments}}]
    assert len(turn.prompt_ids) == r.usage.input_tokens
    assert len(turn.response_ids) == len(turn.response_logprobs) == r.usage.output_tokens
    prompt = tok.decode(turn.prompt_ids)
    assert "You are terse." in prompt and "<tools>" in prompt and "Weather in Paris?" in prompt
    assert turn.messages[0]["role"] == "system" and turn.messages[0]["content"].startswith("You are terse.")

    follow = ask + [item.model_dump(exclude_none=True) for item in r.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "12 degrees, rain"}]
    openai_client.responses.create(model="clawray-policy", instructions="You are terse.", input=follow,
                                   tools=[TOOL], max_output_tokens=5, extra_headers={"X-Session-Id": sid})
    first, second = app_turns(serve_app, sid)
    assert first.next_state == [{"role": "tool", "content": "12 degrees, rain", "tool_call_id": call.call_id}]
    assert "<tool_response>\n12 degrees, rain\n</tool_response>" in tok.decode(second.prompt_ids)


def test_a_streamed_function_call_is_captured_from_the_stream(openai_client, serve_app, no_spaces):
    sid = _sid()
    stream = openai_client.responses.create(
        model="clawray-policy", input="Weather in Oslo?", tools=[TOOL], tool_choice=NAMED, max_output_tokens=120,
        stream=True, extra_body={"logit_bias": no_spaces}, extra_headers={"X-Session-Id": sid})
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    call = _call(events[-1].response)
    (turn,) = app_turns(serve_app, sid)
    assert turn.tool_calls == [{"id": call.call_id, "function": {"name": "get_weather", "arguments": call.arguments}}]
    assert len(turn.response_ids) == len(turn.response_logprobs) == events[-1].response.usage.output_tokens


def test_output_limits_beyond_the_context_are_served_and_recorded(openai_client, serve_app):
    context = serve_app["config"].model.max_model_len
    claude = anthropic.Anthropic(base_url=serve_app["base_url"], api_key="unused", max_retries=0)
    sids = [_sid() for _ in range(3)]
    # A stop sequence ends each reply early, whatever the limit: the tiny model's greedy reply to "hi" is
    # newlines up to all the context leaves (~2,000 tokens, ~20 s each on 2 cores).
    openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=32000, temperature=0, stop=["\n"],
                                          extra_headers={"X-Session-Id": sids[0]})
    with claude.messages.stream(model="m", max_tokens=32000, messages=[{"role": "user", "content": "hi"}],
                                stop_sequences=["\n"], extra_body={"temperature": 0},
                                extra_headers={"X-Session-Id": sids[1]}) as s:
        s.get_final_message()  # streamed, as Claude Code asks (the SDK refuses 32,000 tokens unstreamed)
    openai_client.responses.create(model="m", input="hi", max_output_tokens=32000, temperature=0,
                                   extra_body={"stop": ["\n"]}, extra_headers={"X-Session-Id": sids[2]})
    for sid in sids:
        (turn,) = app_turns(serve_app, sid)
        assert turn.max_tokens_requested == 32000
        assert turn.max_tokens_granted == context - len(turn.prompt_ids)  # all the rendered prompt left
        assert len(turn.response_ids) < 64  # the stop sequence ended it (not the limit)


def test_what_the_apis_refuse_is_a_clear_400(openai_client, serve_app):
    with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
        openai_client.responses.create(model="m", input="and then?", previous_response_id="resp_abc")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\].type: invalid value 'telepathy'"):
        openai_client.responses.create(model="m", input=[{"type": "telepathy"}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].role: invalid value 'robot'"):
        openai_client.chat.completions.create(model="m", messages=[{"role": "robot", "content": "hi"}])
    context = serve_app["config"].model.max_model_len
    huge = " ".join(["weather"] * (2 * context))
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {context}"):
        openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": huge}],
                                              max_tokens=32000)
