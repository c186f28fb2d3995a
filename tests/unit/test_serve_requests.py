"""Requests real agents send (issue 16 item 3), pure parts: output-token limits (serve/budget.py and the
engine's refusal message), role / content-part / input-item checks of the three client APIs
(serve/validate.py), and the Responses request read as a chat conversation (serve/responses.py)."""

from __future__ import annotations

import json

import pytest

from core.config import EngineConfig, ModelConfig
from serve.budget import (
    OUTPUT_FIELDS,
    cap_output_request,
    clamp_output_request,
    context_full_message,
    requested_output_tokens,
)
from serve.injection import add_to_system
from serve.responses import (
    ResponsesStreamToolCalls,
    apply_view,
    chat_view,
    response_tool_calls,
    stream_error,
)
from serve.turns import RequestError
from serve.validate import check_chat, check_messages, check_responses
from serve.vllm_engine import VLLMServing, refusal

# ---- output-token limits ----------------------------------------------------------------------------


def test_the_requested_limit_is_the_field_the_engine_reads_first():
    chat = OUTPUT_FIELDS["chat"]
    assert requested_output_tokens({"max_tokens": 10, "max_completion_tokens": 7}, chat) == 7
    assert requested_output_tokens({"max_tokens": 10}, chat) == 10
    assert requested_output_tokens({}, chat) is None
    assert requested_output_tokens({"max_tokens": True}, chat) is None  # a bool is no limit
    assert requested_output_tokens({"max_output_tokens": 32000}, OUTPUT_FIELDS["responses"]) == 32000


def test_a_limit_above_the_context_is_lowered_to_it_and_a_fitting_one_is_left_alone():
    body = {"max_tokens": 32000, "max_completion_tokens": 32000}
    clamp_output_request(body, OUTPUT_FIELDS["chat"], 2048)
    assert body == {"max_tokens": 2048, "max_completion_tokens": 2048}
    body = {"max_tokens": 2048}
    clamp_output_request(body, OUTPUT_FIELDS["messages"], 2048)
    assert body == {"max_tokens": 2048}
    body = {"max_tokens": 100, "max_output_tokens": "many"}
    clamp_output_request(body, OUTPUT_FIELDS["responses"], 50)
    assert body == {"max_tokens": 100, "max_output_tokens": "many"}  # other API's field, and no integer


def test_the_engine_clamps_before_vllm_sees_the_request_unless_configured_off():
    on = VLLMServing("m", ModelConfig(max_model_len=2048), EngineConfig())
    assert on._fit({"max_tokens": 32000}, "messages") == {"max_tokens": 2048}
    assert on._fit({"max_output_tokens": 9000}, "responses") == {"max_output_tokens": 2048}
    off = VLLMServing("m", ModelConfig(max_model_len=2048), EngineConfig(clamp_max_tokens=False))
    assert off._fit({"max_tokens": 32000}, "messages") == {"max_tokens": 32000}


def test_the_operators_output_cap_lowers_larger_limits_and_bounds_requests_that_name_none():
    body = {"max_tokens": 32000, "max_completion_tokens": 50}
    cap_output_request(body, OUTPUT_FIELDS["chat"], 64)
    assert body == {"max_tokens": 64, "max_completion_tokens": 50}
    body = {}  # vLLM would grant everything the context leaves: the cap goes in the API's first field
    cap_output_request(body, OUTPUT_FIELDS["chat"], 64)
    assert body == {"max_completion_tokens": 64}
    body = {"max_output_tokens": "many"}  # no integer: left for vLLM's validation to refuse
    cap_output_request(body, OUTPUT_FIELDS["responses"], 64)
    assert body == {"max_output_tokens": "many"}
    capped = VLLMServing("m", ModelConfig(max_model_len=2048), EngineConfig(max_output_tokens=64))
    assert capped._fit({"max_tokens": 32000}, "messages") == {"max_tokens": 64}
    assert capped._fit({}, "responses") == {"max_output_tokens": 64}
    assert capped._fit({"max_tokens": 8}, "chat") == {"max_tokens": 8}


class _Refused(ValueError):
    """vLLM's VLLMValidationError, as the engine sees it (parameter and value attributes)."""

    def __init__(self, message: str, parameter: str, value: int):
        super().__init__(message)
        self.parameter, self.value = parameter, value


def test_a_prompt_that_fills_the_context_is_a_400_naming_the_numbers():
    zero = _Refused("max_tokens must be at least 1, got 0.", "max_tokens", 0)
    err = refusal(zero, 2048, 2048)
    assert err.status == 400 and err.message == context_full_message(2048)
    assert "2048 tokens" in err.message and "no output token fits" in err.message
    assert refusal(zero, None, 2048).message == context_full_message(2048)  # no limit asked: same cause
    assert refusal(zero, 0, 2048).message == str(zero)  # the client asked for 0 itself
    other = _Refused("This model's maximum context length is 2048 tokens. However, your prompt contains "
                     "2100 input tokens", "input_tokens", 2100)
    assert refusal(other, 2048, 2048).message == str(other)


# ---- roles, content parts, input items ---------------------------------------------------------------


def _refused(check, body) -> str:
    with pytest.raises(RequestError) as e:
        check(body)
    assert e.value.status == 400
    return str(e.value)


def test_chat_roles_and_part_types_as_openai_checks_them():
    ok = {"messages": [{"role": "developer", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                    {"type": "image_url", "image_url": {"url": "x"}},
                                                    {"type": "input_text", "text": "vLLM's"},
                                                    {"image_url": "typeless: vLLM reads it by key"}]},
                       {"role": "assistant", "content": None, "tool_calls": []},
                       {"role": "tool", "tool_call_id": "c", "content": "12C"}]}
    check_chat(ok)
    message = _refused(check_chat, {"messages": [{"role": "user", "content": "hi"}, {"role": "robot"}]})
    assert message.startswith("messages[1].role: invalid value 'robot'") and "'developer'" in message
    message = _refused(check_chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "hologram"}]}]})
    assert message.startswith("messages[0].content[1].type: invalid value 'hologram'")
    assert "messages[0].content must be" in _refused(check_chat, {"messages": [{"role": "user", "content": {}}]})
    assert "'messages' is required" in _refused(check_chat, {})


# Sent by schemathesis in CI (tests/integration/test_fuzz.py, 2026-12-06), trimmed to what mattered: a function
# tool without a name, and a tool_choice naming a function. vLLM's `check_tool_usage` (a "before" validator)
# read tool["function"]["name"] and raised KeyError, which is no ValidationError: a 500.
NAMELESS_TOOL = {"messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"\u0003pgV": {}, "type": "function", "function": {"description": ""}}],
                 "tool_choice": {"function": {"name": "\u00f1\udb51\udd13"}, "": "x"}}


def test_a_chat_function_tool_needs_a_function_object_with_a_name_as_openai_checks_it():
    check_chat({"messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "get_time", "parameters": {}}},
                          {"type": "custom", "custom": {"name": "grammar"}}]})  # other tool types: the engine's
    assert _refused(check_chat, NAMELESS_TOOL) == "Missing required parameter: 'tools[0].function.name'."
    assert _refused(check_chat, {**NAMELESS_TOOL, "tools": [{"type": "function"}]}) == (
        "Missing required parameter: 'tools[0].function'.")
    assert _refused(check_chat, {**NAMELESS_TOOL, "tools": [{"function": {"name": 7}}]}) == (
        "tools[0].function.name must be a string")
    assert _refused(check_chat, {**NAMELESS_TOOL, "tools": [{"type": "function", "function": "f"}]}) == (
        "tools[0].function must be an object")


def test_the_engines_validation_of_a_malformed_tool_is_a_400_not_a_crash():
    """Behind the Proxy's checks too (the engine deployment takes requests from a Proxy of another version)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from serve.protocol import EngineRequestError
    from serve.vllm_engine import _validate

    with pytest.raises(EngineRequestError) as e:
        _validate(ChatCompletionRequest, {**NAMELESS_TOOL, "model": "m"})
    assert e.value.status == 400 and e.value.message == "the request is malformed: a required field is missing ('name')"


def test_anthropic_roles_and_block_types_as_anthropic_checks_them():
    ok = {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"},
                                          {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [{"type": "text", "text": "ok"}]},
                                     {"type": "document", "source": {}}]}]}  # known: the engine decides
    check_messages(ok)
    assert _refused(check_messages, {"messages": [{"role": "tool", "content": "x"}]}).startswith(
        "messages.0.role: invalid value 'tool'")
    assert _refused(check_messages, {"messages": [{"role": "user", "content": [{"type": "video"}]}]}).startswith(
        "messages.0.content[0].type: invalid value 'video'")
    nested = {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                         "content": [{"type": "tool_use"}]}]}]}
    assert _refused(check_messages, nested).startswith("messages.0.content.0.content[0].type: invalid value")


def test_responses_input_items_roles_and_parts_as_openai_checks_them():
    check_responses({"input": "hello"})
    check_responses({"input": [
        {"role": "user", "content": "easy message, no type"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
        {"type": "reasoning", "summary": []}]})
    assert _refused(check_responses, {"input": [{"type": "telepathy"}]}).startswith(
        "input[0].type: invalid value 'telepathy'")
    assert _refused(check_responses, {"input": [{"role": "tool", "content": "x"}]}).startswith(
        "input[0].role: invalid value 'tool'")
    assert _refused(check_responses, {"input": [{"role": "user", "content": [{"type": "text"}]}]}).startswith(
        "input[0].content[0].type: invalid value 'text'")
    assert "'input' is required" in _refused(check_responses, {"model": "m"})
    assert "must be an object" in _refused(check_responses, {"input": ["loose string"]})


def test_server_side_response_state_is_refused_with_how_to_send_the_conversation():
    for body in ({"input": "more", "previous_response_id": "resp_1"},
                 {"input": "more", "conversation": "conv_1"},
                 {"input": [{"id": "msg_1"}]}):  # an item reference
        message = _refused(check_responses, body)
        assert "not supported" in message and "send the whole conversation in `input`" in message


# ---- the Responses request as a chat conversation ----------------------------------------------------


def test_a_responses_request_reads_as_chat_messages_with_instructions_first():
    body = {"instructions": "be terse", "max_output_tokens": 32000, "tools": [{"type": "function", "name": "f"}],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather"},
                                                   {"type": "input_text", "text": "in Oslo?"}]},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "12C"},
                      {"type": "reasoning", "summary": []}]}
    view = chat_view(body)
    assert view["messages"] == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12C"}]
    assert view["tools"] == body["tools"] and view["max_tokens"] == 32000
    assert chat_view({"input": "hi"})["messages"] == [{"role": "system", "content": ""},
                                                      {"role": "user", "content": "hi"}]


def test_text_injected_into_the_view_becomes_the_instructions():
    body = {"instructions": "be terse", "input": "hi"}
    view = chat_view(body)
    add_to_system(view, "SKILLS", anthropic=False)  # what the skill and memory injectors do
    apply_view(body, view)
    assert body["instructions"] == "be terse\n\nSKILLS"
    bare = {"input": "hi"}
    view = chat_view(bare)
    add_to_system(view, "SKILLS", anthropic=False)
    apply_view(bare, view)
    assert bare["instructions"] == "SKILLS"
    untouched = {"input": "hi"}
    apply_view(untouched, chat_view(untouched))  # nothing injected: no empty instructions added
    assert "instructions" not in untouched


def test_the_tool_calls_of_a_reply_and_of_its_stream():
    output = [{"type": "message", "role": "assistant", "content": []},
              {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"unit":"c"}'},
              {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"}]
    calls = [{"id": "c1", "function": {"name": "get_weather", "arguments": '{"unit":"c"}'}},
             {"id": "c2", "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin"}'}}]
    assert response_tool_calls({"output": output}) == [calls]
    stream = ResponsesStreamToolCalls()
    stream.feed('event: response.output_text.delta\ndata: {"delta": "x"}\n\n')
    assert stream.result(1) == [[]]
    completed = {"type": "response.completed", "response": {"output": output}}
    stream.feed(f"event: response.completed\ndata: {json.dumps(completed)}\n\n")
    assert stream.result(2) == [calls, []]


def test_the_in_band_stream_error_is_a_responses_error_event():
    event = stream_error(503, "the engine became unavailable")
    kind, data = event.split("\n")[:2]
    assert kind == "event: error" and event.endswith("\n\n")
    assert json.loads(data[len("data: "):]) == {"type": "error", "code": "server_error", "param": None,
                                                "message": "the engine became unavailable", "sequence_number": 0}


def test_a_text_part_whose_text_is_not_a_string_is_no_text_for_injection_and_identity():
    """Found by the fuzzer (schemathesis, a 500): an Anthropic `system` block with `"text": []` crashed the
    Proxy's memory/skill reading before the engine's validation could answer 400."""
    from serve.injection import last_user_text
    from serve.memory_injection import system_text

    body = {"system": [{"type": "text", "text": []}, {"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": None}, {"type": "text", "text": "hi"}]}]}
    assert system_text(body, anthropic=True) == "be brief"
    assert last_user_text(body["messages"]) == "hi"
    from serve.turns import derive_session_id  # the session id a header-less client gets reads it too

    assert derive_session_id("t", "c", body["messages"]).startswith("derived-")


def test_an_agents_side_request_is_a_side_turn_unless_the_client_says_otherwise():
    # The agents' recorded side requests, and where a marker does not count: tests/unit/test_serve_side.py.
    from serve.side import AGENT_SIDE_MARKERS, SideRules
    from serve.turns import extract_meta

    compact = [{"role": "user", "content": [{"type": "text", "text": "Earlier: ..."},
                                            {"type": "text", "text": f"Rules.\n\n{AGENT_SIDE_MARKERS[0]}, paying ..."}]},
               {"role": "system", "content": "# Environment"}]  # Claude Code puts a system message last
    assert extract_meta({"messages": compact}, {}, "c").turn_type.value == "side"
    assert extract_meta({"messages": compact}, {"x-turn-type": "main"}, "c").turn_type.value == "main"
    # Only the last user message counts: a user quoting the phrase earlier in the conversation is main.
    quoted = [*compact, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    assert extract_meta({"messages": quoted}, {}, "c").turn_type.value == "main"
    # The operator's own markers replace the built-in ones (proxy.side_markers).
    title = [{"role": "user", "content": "Generate a title for this chat: ..."}]
    assert extract_meta({"messages": title}, {}, "c", side=SideRules.build(["Generate a title"])).turn_type.value == "side"
    assert extract_meta({"messages": compact}, {}, "c", side=SideRules.build([])).turn_type.value == "main"
