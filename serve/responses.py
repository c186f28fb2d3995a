"""The OpenAI Responses API at the Proxy (pure): the request read as a chat conversation, and the tool
calls of a reply.

vLLM's own Responses layer (`OpenAIServingResponses`, serve/vllm_engine.py) validates, renders, parses
tool calls and formats the stream; the Proxy only reads the conversation (session identity, skill and
memory retrieval) and puts injected skills and memory into the request. `chat_view` gives the request as
a chat body whose first message is the system prompt (`instructions`), so the chat route's injection code
runs on it unchanged; `apply_view` then writes that system message back as `instructions`, which vLLM
renders as the leading system message, where the chat route injects too.
"""

from __future__ import annotations

import json
from typing import Any

from core.text import content_text

TOOL_CALL_ITEMS = ("function_call", "custom_tool_call")
TOOL_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


def _call(item: dict[str, Any]) -> dict[str, Any]:
    """A function (or custom tool) call item in the OpenAI chat `tool_calls` shape Turn stores. A custom
    tool's free-form input is the model's `{"input": ...}` arguments, as vLLM's shim encodes it when the
    call comes back in the next request's history (responses/utils.py `encode_custom_tool_input`)."""
    if item.get("type") == "custom_tool_call":
        args = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
    else:
        args = item.get("arguments") or ""
    return {"id": item.get("call_id"), "function": {"name": item.get("name") or "", "arguments": args}}


def input_messages(items: Any) -> list[dict[str, Any]]:
    """`input` (text, or checked items: serve/validate.py) as chat messages: roles, text and tool calls
    (what session identity and retrieval read). Items that carry no conversation (reasoning, ...) are left
    out."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": content_text(item.get("content"))})
        elif kind in TOOL_CALL_ITEMS:
            out.append({"role": "assistant", "content": None, "tool_calls": [_call(item)]})
        elif kind in TOOL_OUTPUT_ITEMS:
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": content_text(item.get("output"))})
    return out


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as a chat body: a leading system message holding `instructions` (empty when none),
    the input as messages, the tools, and the output limit as `max_tokens` (memory's room estimate)."""
    view: dict[str, Any] = {"messages": [{"role": "system", "content": body.get("instructions") or ""},
                                         *input_messages(body.get("input"))]}
    if body.get("tools"):
        view["tools"] = body["tools"]
    if body.get("max_output_tokens") is not None:
        view["max_tokens"] = body["max_output_tokens"]
    return view


def apply_view(body: dict[str, Any], view: dict[str, Any]) -> None:
    """Write the view's system message (instructions plus what was injected) back as `instructions`."""
    system = view["messages"][0].get("content")
    if system:
        body["instructions"] = system


def response_tool_calls(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The tool calls of a Responses reply (its `function_call` output items), as one choice's list."""
    output = body.get("output") or []
    return [[_call(i) for i in output if isinstance(i, dict) and i.get("type") in TOOL_CALL_ITEMS]]


class ResponsesStreamToolCalls:
    """The tool calls of a Responses stream, read from its `response.completed` event (the whole reply)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def feed(self, event: str) -> None:
        if not event.startswith("event: response.completed"):
            return
        for line in event.splitlines():
            if line.startswith("data:"):
                self.calls = response_tool_calls(json.loads(line[5:]).get("response") or {})[0]

    def result(self, n: int) -> list[list[dict[str, Any]]]:
        return [self.calls] + [[] for _ in range(n - 1)]


def stream_error(status: int, message: str) -> str:
    """An in-band Responses `error` event (the stream's headers are already sent)."""
    event = {"type": "error", "code": "server_error" if status >= 500 else "invalid_request_error",
             "message": message, "param": None, "sequence_number": 0}
    return f"event: error\ndata: {json.dumps(event)}\n\n"
