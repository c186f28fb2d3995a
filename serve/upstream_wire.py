"""Upstream mode, the pure part: what clawray adds to a request for an external OpenAI-compatible API, what
it captures from the reply, and what it strips again before the client sees it. No I/O, no Ray.

Capture: clawray asks the upstream for the sampled tokens' logprobs (`logprobs: true`, standard OpenAI)
and, when the upstream is vLLM, for token ids (`return_token_ids: true`). An upstream that refuses one of
these fields by name gets requests without it from then on (`Caps`). A `Turn` keeps ids and logprobs only
when it has both, one logprob per id (the contract); otherwise it keeps the text and tool calls only,
which the skills loop uses but training skips.

Anthropic `/v1/messages` requests are translated with vLLM's own `AnthropicServingMessages` converters
(the same code that serves them in vLLM mode; the converters use no engine state).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from serve.capture import Capture
from serve.protocol import EngineRequestError

MAX_MESSAGE_CHARS = 300
# What an Anthropic request becomes upstream: standard OpenAI chat fields only (vLLM's translation also
# sets vLLM-only fields such as top_k, which other OpenAI-compatible servers refuse).
OPENAI_FIELDS = ("messages", "max_completion_tokens", "stop", "temperature", "top_p", "stream",
                 "response_format", "reasoning_effort")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass
class Caps:
    """Optional capture fields the upstream has not refused (yet)."""

    logprobs: bool = True
    token_ids: bool = True  # vLLM's `return_token_ids`

    def refused(self, message: str, asked: Asked) -> bool:
        """Turn off a field the upstream's 400 names, if clawray added it (not the client): True = retry
        without it."""
        for name, attr in (("return_token_ids", "token_ids"), ("logprobs", "logprobs")):
            if getattr(self, attr) and not getattr(asked, attr) and name in message:
                setattr(self, attr, False)
                return True
        return False


@dataclass(frozen=True)
class Asked:
    """What the client itself asked for (everything else we added is stripped from its reply)."""

    logprobs: bool
    token_ids: bool


def upstream_payload(body: dict[str, Any], model: str, caps: Caps) -> tuple[dict[str, Any], Asked]:
    asked = Asked(bool(body.get("logprobs")), bool(body.get("return_token_ids")))
    payload = {**body, "model": model}
    if caps.logprobs and not asked.logprobs:
        payload["logprobs"] = True  # without top_logprobs: only the sampled token's logprob
    if caps.token_ids and not asked.token_ids:
        payload["return_token_ids"] = True
    return payload, asked


def _logprobs(choice: dict[str, Any]) -> list[float]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return [float(e["logprob"]) for e in content if isinstance(e, dict) and "logprob" in e]


def _settle(cap: Capture) -> Capture:
    """Keep ids + logprobs only where both exist one-to-one (the Turn contract); else neither."""
    for c in cap.choices.values():
        if not c.token_ids or len(c.token_ids) != len(c.logprobs):
            c.token_ids, c.logprobs = [], []
    return cap


PROMPT_NAME = b'"prompt_token_ids"'
PROMPT_KEY = re.compile(rb'"prompt_token_ids" ?: ?\[')
IDS_RE = re.compile(rb"\[[0-9, ]*\]")  # no line breaks: the text goes into a JSON-lines file as it is


def cut_prompt_ids(raw: bytes) -> tuple[bytes, bytes] | None:
    """A reply body with its top-level `prompt_token_ids` array replaced by null, and that array's JSON text;
    None when there is none to cut (the caller then parses the reply whole).

    The name's quotes are unescaped only where it is a key or a whole string (in a string they are `\\"`),
    it must occur once, and the array must be plain digits, so this never cuts inside a string or picks one
    of two keys; `top_level_cut` checks the parsed reply to rule out a nested key of the same name."""
    key = PROMPT_KEY.search(raw)
    if key is None or raw.count(PROMPT_NAME) != 1:
        return None
    begin = key.end() - 1
    end = raw.find(b"]", begin)
    if end < 0 or not IDS_RE.fullmatch(raw, begin, end + 1):
        return None
    return raw[:begin] + b"null" + raw[end + 1:], raw[begin:end + 1]


def top_level_cut(data: Any) -> bool:
    """Whether the reply parsed from `cut_prompt_ids`'s body had its null at the top level."""
    return isinstance(data, dict) and "prompt_token_ids" in data and data["prompt_token_ids"] is None


def capture_body(data: dict[str, Any], prompt_json: bytes | None = None) -> Capture:
    """Capture of a non-streaming chat completion body; `prompt_json`: its prompt ids, cut out unparsed."""
    cap = Capture(key=str(data.get("id", "")), prompt_ids=list(data.get("prompt_token_ids") or []), done=True)
    if prompt_json is not None and prompt_json.strip(b"[] "):
        cap.prompt_json = prompt_json
    for ch in data.get("choices") or []:
        c = cap.choice(int(ch.get("index", 0)))
        c.token_ids = list(ch.get("token_ids") or [])
        c.logprobs = _logprobs(ch)
        c.text = (ch.get("message") or {}).get("content") or ""
        c.finish_reason = ch.get("finish_reason")
    return _settle(cap)


def strip_body(data: dict[str, Any], asked: Asked) -> dict[str, Any]:
    """Remove what clawray added (in place): the client sees what it asked for."""
    if not asked.token_ids:
        data.pop("prompt_token_ids", None)
    for ch in data.get("choices") or []:
        if not asked.token_ids:
            ch.pop("token_ids", None)
        if not asked.logprobs and "logprobs" in ch:
            ch["logprobs"] = None
    return data


@dataclass
class StreamCapture:
    """Folds streamed chat chunks (already parsed) into a `Capture`."""

    cap: Capture = field(default_factory=lambda: Capture(key=""))

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("prompt_token_ids") and not self.cap.prompt_ids:
            self.cap.prompt_ids = list(chunk["prompt_token_ids"])
        for ch in chunk.get("choices") or []:
            c = self.cap.choice(int(ch.get("index", 0)))
            c.token_ids.extend(ch.get("token_ids") or [])
            c.logprobs.extend(_logprobs(ch))
            c.text += (ch.get("delta") or {}).get("content") or ""
            if ch.get("finish_reason"):
                c.finish_reason = ch["finish_reason"]

    def capture(self) -> Capture:
        self.cap.done = True
        return _settle(self.cap)


def strip_chunk(chunk: dict[str, Any], asked: Asked) -> bool:
    """`strip_body` for one stream chunk; True when something was removed (the chunk must be re-encoded)."""
    changed = False
    if not asked.token_ids and "prompt_token_ids" in chunk:
        del chunk["prompt_token_ids"]
        changed = True
    for ch in chunk.get("choices") or []:
        if not asked.token_ids and "token_ids" in ch:
            del ch["token_ids"]
            changed = True
        if not asked.logprobs and ch.get("logprobs") is not None:
            ch["logprobs"] = None
            changed = True
    return changed


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` payloads of a server-sent-event stream, given its lines (without line breaks)."""
    buf: list[str] = []
    async for line in lines:
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
        elif line.startswith("data:"):
            buf.append(line[6:] if line.startswith("data: ") else line[5:])
    if buf:
        yield "\n".join(buf)


def error_message(text: str, secrets: list[str]) -> str:
    """The upstream's error message for a client: one line, capped, secrets redacted."""
    try:
        data = json.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") or err.get("detail") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        msg = text
    msg = re.sub(r"\s+", " ", str(msg or "no details")).strip()
    for s in secrets:
        msg = msg.replace(s, "***")
    return msg[:MAX_MESSAGE_CHARS]


# ---- Anthropic over an OpenAI upstream (vLLM's converters) ----------------------------------------------

def anthropic_to_openai(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An Anthropic Messages request as an OpenAI chat request. Returns (payload, OpenAI messages)."""
    from pydantic import ValidationError
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    try:
        req = AnthropicMessagesRequest.model_validate(body)
        chat = AnthropicServingMessages.to_chat_completion_request(req)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise EngineRequestError(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))) from None
    except (ValueError, TypeError) as e:
        raise EngineRequestError(400, str(e)) from None
    keep = OPENAI_FIELDS + (TOOL_FIELDS if chat.tools else ())
    payload = chat.model_dump(mode="json", exclude_none=True, include=set(keep))
    if chat.stream:
        payload["stream_options"] = {"include_usage": True}  # the converter ends on the usage chunk
    messages = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in chat.messages]
    return payload, messages


def _converters() -> Any:
    # NOTE: vLLM's `messages_full_converter` / `message_stream_converter` are instance methods that use
    # no instance state; an instance built without __init__ (no engine) runs them. A vLLM upgrade that
    # changes this fails tests/unit/test_serve_upstream_wire.py, not silently.
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    return object.__new__(AnthropicServingMessages)


def openai_to_anthropic(data: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    try:
        out = _converters().messages_full_converter(ChatCompletionResponse.model_validate(data))
    except ValueError as e:  # incl. pydantic errors and tool arguments that are not JSON
        raise EngineRequestError(502, f"the upstream reply cannot be expressed as a message: {e}",
                                 "upstream_error") from None
    return out.model_dump(mode="json", exclude_none=True)


def anthropic_events(openai_sse: AsyncIterator[str]) -> AsyncIterator[str]:
    """Anthropic SSE events from OpenAI SSE strings (`data: {...}\\n\\n`, ending with `data: [DONE]`)."""
    return _converters().message_stream_converter(openai_sse)


def role_chunk(chunk: dict[str, Any]) -> str:
    """A content-free first chunk like vLLM's: the converter turns the first chunk into `message_start`
    only, so an upstream that puts text in its first chunk would otherwise lose it."""
    first = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
    first["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""}}]
    return f"data: {json.dumps(first)}\n\n"
