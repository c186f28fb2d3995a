"""Which stored turn a request continues, and with what next state (pure; DESIGN.md request path 4).

A turn is one *exchange*: the messages it answered (the request's messages after its last assistant
message) and its reply. The next request of a conversation repeats that exchange in its history and
adds what followed: the turn's next state. So a pending turn is completed only by a request whose history
contains its exchange, and its next state is what follows its assistant message there, up to (not
including) the next assistant message. Nothing else of the session is involved: two conversations under
one session id, a crash that lost a turn in between, or a client that sends only a sliding window of the
conversation all keep each next state with its own turn.

Identity of a message (`_identity`): role and text (an assistant's text stripped of surrounding
whitespace); an assistant message that made tool calls is identified by its calls alone (name + canonical
JSON arguments, in order), because the text beside a call is what the tool parser left over, which the
client may echo differently. Call ids, system messages (where skills are injected) and non-text parts are
ignored. Both the OpenAI and the Anthropic message shapes are read. Keys are 16-byte BLAKE2b digests,
kept as hex on the stored row. Cost: one pass over the messages, each hashed twice, tool-call arguments
parsed once (on this 2-core machine: ~25 us for a 4-message chat, ~2.5 ms for an agent history of 150
messages / 105 KB with 50 tool calls, less than parsing that request's JSON body twice).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

SKIPPED_ROLES = ("system", "developer")
SEP = b"\x1e"  # between the parts hashed into one key


def _hash(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p)
        h.update(SEP)
    return h.digest()


def _text(content: Any) -> str:
    """Text of a message's content: a string, or the text (and nested `tool_result`) parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # a stray non-string `text` (engines ignore unknown keys) reads as none
        return "".join(_text(p.get("text")) or _text(p.get("content")) for p in content
                       if isinstance(p, dict) and p.get("type") != "tool_use")
    return ""


def _arguments(args: Any) -> str:
    """Tool-call arguments as canonical JSON (key order and spacing never matter); raw text otherwise."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return " ".join(args.split())
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _tool_calls(message: dict[str, Any]) -> list[str]:
    """`name(arguments)` of each tool call: OpenAI `tool_calls`, or Anthropic `tool_use` content blocks."""
    calls = []
    listed = message.get("tool_calls")
    for tc in listed if isinstance(listed, list) else ():
        fn = tc.get("function") if isinstance(tc, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        calls.append(f"{fn.get('name') or ''}({_arguments(fn.get('arguments') or '')})")
    content = message.get("content")
    if isinstance(content, list):
        calls += [f"{b.get('name') or ''}({_arguments(b.get('input') or {})})" for b in content
                  if isinstance(b, dict) and b.get("type") == "tool_use"]
    return calls


def _identity(message: dict[str, Any]) -> bytes:
    role = str(message.get("role") or "")
    if role != "assistant":  # the client's own messages: sent the same way each time, taken as they are
        return f"{role}\x1dtext\x1d{_text(message.get('content'))}".encode()
    calls = _tool_calls(message)
    body = "\x1f".join(calls) if calls else _text(message.get("content")).strip()
    return f"{role}\x1d{'call' if calls else 'text'}\x1d{body}".encode()


def reply_identity(text: str, tool_calls: list[dict[str, Any]]) -> bytes:
    """The identity of an assistant reply the engine produced, as the client will echo it."""
    return _identity({"role": "assistant", "content": text, "tool_calls": tool_calls})


@dataclass(frozen=True)
class History:
    """What one request's messages say about earlier turns, computed once per request (`read_history`).

    `request_key`: the whole conversation (system messages aside) and the request's other parameters: a
    client retry (the same body again) has the same one; the same conversation asked with other
    parameters (max_tokens, stop, ...) is another request.
    `context`: digest of the messages this request's own reply answers (after its last assistant message).
    `continuations`: exchange key -> next state, one per assistant message that something followed.
    """

    request_key: str
    context: bytes
    continuations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def turn_key(self, text: str, tool_calls: list[dict[str, Any]]) -> str:
        """The exchange key of this request's reply: what a continuing request will carry for it."""
        return _hash(self.context, reply_identity(text, tool_calls)).hex()


def params_key(body: dict[str, Any]) -> bytes:
    """Digest of a request body's parameters other than its messages (taken before the engine sees it)."""
    params = {k: v for k, v in body.items() if k != "messages"}
    return _hash(json.dumps(params, sort_keys=True, separators=(",", ":"), default=str).encode())


def read_history(messages: list[Any], params: bytes = b"") -> History:
    """The keys of `messages` (a request's conversation as the engine rendered it; `params`: its
    `params_key`). Malformed entries are skipped, never raised on: bad input is refused elsewhere."""
    whole = hashlib.blake2b(params, digest_size=16)
    context = hashlib.blake2b(digest_size=16)  # the messages after the last assistant message so far
    continuations: dict[str, list[dict[str, Any]]] = {}
    open_key: str | None = None  # the last assistant message's key, until its next state is known
    following: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") in SKIPPED_ROLES:
            continue
        ident = _identity(m)
        whole.update(ident)
        whole.update(SEP)
        if m.get("role") == "assistant":
            if open_key is not None and following:  # a repeated exchange: the later one (the newest) wins
                continuations[open_key] = following
            open_key, following = _hash(context.digest(), ident).hex(), []
            context = hashlib.blake2b(digest_size=16)
        else:
            context.update(ident)
            context.update(SEP)
            following.append(m)
    if open_key is not None and following:
        continuations[open_key] = following
    return History(whole.hexdigest(), context.digest(), continuations)
