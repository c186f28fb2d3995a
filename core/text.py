"""The text of a chat message's content, read one way by every plane.

A content is a string, or a list of parts (OpenAI `text` / `input_text` / `output_text`, Anthropic `text`
blocks, ...): the text is the parts' string `text` fields joined by `sep`. Anything else reads as no text:
requests are read before the engine validates them, so a part whose `text` is not a string must not
crash a reader (a TypeError there was a 500, found by the fuzzer); the engine then refuses the request.
Tool results (`tool_result` blocks keep their text under `content`) are not the message's own text.
"""

from __future__ import annotations

from typing import Any


def text_parts(content: Any) -> list[str]:
    """Each text of a content: the string, or each part's string `text` (tool results are no text parts)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str)]
    return []


def content_text(content: Any, sep: str = " ") -> str:
    return sep.join(text_parts(content))
