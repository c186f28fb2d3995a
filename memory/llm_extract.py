"""The LLM extractor: one chat call per batch through `core.llm.LLMClient`, strict JSON, validated, retried.

The reply must be exactly `{"units": [{"kind", "content", "key", "scope", "confidence"}]}` (a ```json fence
around it is tolerated); anything else — extra fields, unknown kinds, an empty content — is refused with
the reason, and the model is asked again with that reason, `retries` times. `LLMError` (the endpoint
failed after the client's own retries) propagates: the ingestor keeps the turns and tries later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memory.store import InboxEntry
from memory.units import MAX_CONTENT_CHARS, MAX_KEY_CHARS, Candidate, Kind, Level

MAX_UNITS = 20
MAX_PROMPT_CHARS = 8000  # the most recent part of the batch's conversation is kept
SYSTEM = """You maintain an assistant's long-term memory about its user. From the conversation excerpt, \
extract only what will still be useful in a later conversation. Kinds:
- preference: how the user likes things done (scope "user" unless it is about this project only)
- semantic: stable facts about the user or the project
- project_state: where a piece of work stands (done, blocked, next step, deadline)
- episodic: a notable event of this conversation, with its date if known
- working_summary: at most one, a short summary of the conversation so far (scope "session")
Write each unit as one self-contained sentence in the third person ("The user prefers ..."). Give a short \
`key` naming the slot a fact fills (e.g. "editor", "status of billing migration") when a later fact \
could replace it, else null. Skip small talk, questions, and anything the assistant said on its own.
Reply with ONLY this JSON object and nothing else:
{"units": [{"kind": "...", "content": "...", "key": null, "scope": "user|workspace|session", \
"confidence": 0.0-1.0}]}"""


class ExtractionError(ValueError):
    """The LLM's reply was not the required JSON (after the retries)."""


class _Unit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Kind
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    key: str | None = Field(default=None, max_length=MAX_KEY_CHARS)
    scope: Level
    confidence: float = Field(ge=0, le=1)


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    units: list[_Unit] = Field(max_length=MAX_UNITS)


def parse_reply(text: str, source_turns: list[str]) -> list[Candidate]:
    """Candidates from the model's reply; ExtractionError saying what is wrong otherwise."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise ExtractionError(f"not JSON: {e.msg} at character {e.pos}") from None
    try:
        reply = _Reply.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ExtractionError(f"invalid reply at {where or '<root>'}: {first['msg']}") from None
    out = []
    for u in reply.units:
        key = "summary" if u.kind == Kind.working_summary else u.key
        level = Level.session if u.kind == Kind.working_summary else u.scope
        try:
            out.append(Candidate(kind=u.kind, content=u.content, key=key or None, level=level,
                                 confidence=u.confidence, source_turns=source_turns))
        except ValidationError as e:  # e.g. content of whitespace only
            raise ExtractionError(f"invalid unit: {e.errors()[0]['msg']}") from None
    return out


def conversation(entries: Sequence[InboxEntry]) -> str:
    """The batch as `User: ...` / `Assistant: ...` lines, cut from the front to MAX_PROMPT_CHARS."""
    lines = []
    for e in entries:
        lines += [f"User: {t.strip()}" for t in e.user_texts if t.strip()]
        if e.assistant_text.strip():
            lines.append(f"Assistant: {e.assistant_text.strip()}")
    text = "\n".join(lines)
    return text[-MAX_PROMPT_CHARS:]


class LLMExtractor:
    """Args: client (`core.llm.LLMClient`, or anything with its async `chat`), retries after an invalid
    reply, max_tokens of the reply."""

    name = "llm"

    def __init__(self, client: Any, retries: int = 2, max_tokens: int = 1024):
        self.client, self.retries, self.max_tokens = client, retries, max_tokens
        self.invalid_replies = 0

    async def extract(self, entries: Sequence[InboxEntry]) -> list[Candidate]:
        if not entries:
            return []
        day = entries[0].created_at
        messages: list[dict[str, str]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Conversation (started at unix time {day:.0f}):\n{conversation(entries)}"}]
        turns, refused = [e.turn_id for e in entries], 0
        while True:
            (text,) = await self.client.chat(messages, temperature=0.0, max_tokens=self.max_tokens)
            try:
                return parse_reply(text, turns)
            except ExtractionError as e:
                self.invalid_replies += 1
                refused += 1
                if refused > self.retries:
                    raise
                messages = [*messages, {"role": "assistant", "content": text[:2000]},
                            {"role": "user", "content": f"That reply was refused ({e}). Reply again with "
                                                        "the JSON object only, exactly as specified."}]
