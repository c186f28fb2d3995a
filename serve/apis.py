"""The client APIs the Proxy speaks, side by side: OpenAI chat completions, Anthropic messages, OpenAI
Responses. Per API: the engine methods (`<name>` and `<name>_stream`; its output-token fields are
serve/budget.py's `OUTPUT_FIELDS[<name>]`), the error shape, the request checks (serve/validate.py), how a
reply's tool calls are read (body or stream), the in-band stream error, and the view of the request that
session identity and injection read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from serve import responses
from serve.http import anthropic_error, openai_error
from serve.turns import AnthropicStreamToolUse, StreamToolCalls, tool_calls_of
from serve.validate import check_chat, check_messages, check_responses


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


def _nothing(body: dict[str, Any], view: dict[str, Any]) -> None:
    return None


def openai_stream_error(status: int, message: str) -> str:
    return f"data: {json.dumps({'error': {'message': message, 'type': 'server_error', 'code': status}})}\n\n"


def anthropic_stream_error(status: int, message: str) -> str:
    kind = "overloaded_error" if status == 503 else "api_error"
    data = {"type": "error", "error": {"type": kind, "message": message}}
    return f"event: error\ndata: {json.dumps(data)}\n\n"


@dataclass(frozen=True)
class Api:
    name: str  # the engine method and the metrics route label: chat | messages | responses
    anthropic: bool  # injected text goes to Anthropic's `system` (else the leading system message)
    error: Callable[[int, str], JSONResponse]
    check: Callable[[dict[str, Any]], None]  # raises RequestError
    tool_calls: Callable[[dict[str, Any]], list[list[dict[str, Any]]]]  # per choice, of a reply body
    stream_tools: Callable[[dict[str, Any]], Any]  # request body -> a stream accumulator, or None
    stream_error: Callable[[int, str], str]
    view: Callable[[dict[str, Any]], dict[str, Any]] = _same  # what identity and injection read
    apply_view: Callable[[dict[str, Any], dict[str, Any]], None] = _nothing  # injection back into the body


CHAT = Api("chat", False, openai_error, check_chat, tool_calls_of,
           lambda body: StreamToolCalls() if body.get("tools") else None, openai_stream_error)
MESSAGES = Api("messages", True, anthropic_error, check_messages, tool_calls_of,
               lambda body: AnthropicStreamToolUse(), anthropic_stream_error)
RESPONSES = Api("responses", False, openai_error, check_responses, responses.response_tool_calls,
                lambda body: responses.ResponsesStreamToolCalls() if body.get("tools") else None,
                responses.stream_error, responses.chat_view, responses.apply_view)
