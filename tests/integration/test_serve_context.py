"""Context management through the Proxy against real vLLM on CPU (issue 16 item 4; the policy:
serve/context.py): an agent conversation whose tool results make it far longer than the engine's context
(2,048 tokens) is served, the captured turn holds exactly the fitted prompt the engine saw and stays linked
to the next request; a request whose latest message alone does not fit is a clear 400 in each API's shape.
The token estimate the policy fits with is checked against the prompt ids vLLM rendered."""

from __future__ import annotations

import json
import uuid

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from memory.budget import make_counter
from serve.context import conversation_tokens
from tests.integration.helpers import session_turns

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def _sid() -> str:
    return f"ctx-{uuid.uuid4().hex[:10]}"


def _file(i: int) -> str:
    return "".join(f"line {j} of module {i}: value = {j * 7 + i}\n" for j in range(40))


def agent_messages(steps: int = 12) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find where value 77 is set."}]
    for i in range(steps):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{
                     "id": f"call_{i}", "type": "function",
                     "function": {"name": "read_file", "arguments": json.dumps({"path": f"m{i}.py"})}}]},
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": _file(i)}]
    return msgs


@pytest.fixture(scope="module")
def model(serve_app):
    path = serve_app["config"].model_path()
    return serve_app["config"].model.max_model_len, AutoTokenizer.from_pretrained(path), make_counter(path)


def test_a_session_longer_than_the_context_is_served_fitted_and_stays_linked(openai_client, serve_app, model):
    context_len, tok, counter = model
    sid = _sid()
    msgs = agent_messages()
    text = _file(3)
    assert counter.count(text) == len(tok(text, add_special_tokens=False)["input_ids"])  # the served tokenizer
    assert conversation_tokens(msgs, "openai", counter, tools=TOOLS) > 2 * context_len
    r = openai_client.chat.completions.create(model="clawray-policy", messages=msgs, tools=TOOLS, max_tokens=8,
                                              extra_headers={"X-Session-Id": sid})
    (turn,) = session_turns(serve_app["config"].storage_path(), sid)
    rec = turn.context
    assert rec["policy"] == "trim" and rec["tokens_before"] > 2 * context_len
    assert rec["dropped_messages"] + rec["shortened_tool_results"] > 0
    assert len(turn.prompt_ids) == r.usage.prompt_tokens < context_len
    assert len(turn.prompt_ids) + turn.max_tokens_granted <= context_len
    assert len(turn.prompt_ids) <= conversation_tokens(turn.messages, "openai", counter, tools=TOOLS)  # over-counts
    prompt = tok.decode(turn.prompt_ids)
    assert "You are a coding agent." in prompt and "Find where value 77 is set." in prompt
    assert _file(11) in prompt and "line 0 of module 0" not in prompt  # the latest result whole, the oldest gone

    reply = r.choices[0].message.model_dump(exclude_none=True)
    follow = [*msgs, reply, {"role": "user", "content": "Thanks. Now fix it."}]
    openai_client.chat.completions.create(model="clawray-policy", messages=follow, tools=TOOLS, max_tokens=8,
                                          extra_headers={"X-Session-Id": sid})
    first, second = session_turns(serve_app["config"].storage_path(), sid)
    assert first.next_state == [{"role": "user", "content": "Thanks. Now fix it."}]  # linked through the fit
    assert second.context is not None and len(second.prompt_ids) < context_len


def test_an_anthropic_stream_longer_than_the_context_is_served_fitted(serve_app, model):
    context_len, tok, _ = model
    claude = anthropic.Anthropic(base_url=serve_app["base_url"], api_key="unused", max_retries=0)
    sid = _sid()
    msgs = [{"role": "user", "content": "Find where value 77 is set."}]
    for i in range(12):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
                                                    "input": {"path": f"m{i}.py"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                               "content": _file(i)}]}]
    tools = [{"name": "read_file", "description": "Read a file", "input_schema": TOOLS[0]["function"]["parameters"]}]
    with claude.messages.stream(model="clawray-policy", max_tokens=32000, system="You are a coding agent.",
                                messages=msgs, tools=tools, extra_headers={"X-Session-Id": sid}) as stream:
        final = stream.get_final_message()
    (turn,) = session_turns(serve_app["config"].storage_path(), sid)
    assert final.usage.input_tokens == len(turn.prompt_ids) < context_len
    assert turn.context["tokens_before"] > 2 * context_len and turn.max_tokens_requested == 32000
    assert _file(11) in tok.decode(turn.prompt_ids)


def test_a_latest_message_longer_than_the_context_is_a_clear_400(openai_client, serve_app, model):
    context_len, _, counter = model
    huge = "".join(_file(i) for i in range(8))
    assert counter.count(huge) > context_len
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="clawray-policy", max_tokens=8,
                                              messages=[{"role": "user", "content": huge}])
    assert f"maximum context length is {context_len} tokens" in str(e.value) and "Shorten" in str(e.value)
    claude = anthropic.Anthropic(base_url=serve_app["base_url"], api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="clawray-policy", max_tokens=8, messages=[{"role": "user", "content": huge}])
    assert f"maximum context length is {context_len} tokens" in str(e.value)


def test_summarize_asks_a_real_openai_compatible_model_and_the_fitted_request_still_fits(serve_app, model):
    """The `summarize` policy against the nearest real thing to a hosted LLM: this system's own
    OpenAI-compatible endpoint (vLLM on CPU) as the summariser, through core/llm.py."""
    import asyncio

    from core.config import ContextConfig
    from serve.context_manager import SUMMARY_HEADER, SUMMARY_PROMPT, ContextManager

    context_len, _, _ = model
    # The summariser is a 2,048-token model too: the transcript it is sent is kept within that.
    cfg = ContextConfig(policy="summarize", summary_max_tokens=32, summary_input_tokens=1024,
                        summarizer={"base_url": serve_app["base_url"] + "/v1", "model": "clawray-base"})
    manager = ContextManager.from_args(cfg, {"context_len": context_len,
                                             "tokenizer_path": serve_app["config"].model_path()})
    body = {"messages": agent_messages(), "tools": TOOLS, "max_tokens": 8}
    record = asyncio.run(manager.fit(body, "chat", main=True))
    assert record["dropped_messages"] > 0 and "summarized" in record, record
    asked = [t for t in session_turns(serve_app["config"].storage_path())
             if any(SUMMARY_PROMPT in str(m.get("content")) for m in t.messages)]
    assert asked and "line 39 of module" in json.dumps(asked[-1].messages)  # it read what was dropped
    assert len(asked[-1].prompt_ids) < context_len  # and was sent what fits the summariser's context
    # Whatever it answered (the random tiny model's greedy summary is whitespace, which is no summary and
    # leaves the request trimmed), the system prompt stays first and the fitted request fits.
    system = body["messages"][0]["content"]
    assert system.startswith("You are a coding agent.") and (SUMMARY_HEADER in system) is record["summarized"]
    assert manager.prompt_tokens(body, "chat") + manager.reply_room(body, "chat") <= context_len
