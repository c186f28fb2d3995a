"""Ask an LLM until its reply parses: the one retry loop of the evolvers that want structured output.

`ask_valid` sends `messages`, hands the reply to `parse`, and on a `ValueError` sends the reply back with
the error ("That reply was rejected: ...") up to `attempts` times. The LLM client (core.llm.LLMClient, or
anything with its async `chat`) does its own transport retries; an `LLMError` from it ends the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class InvalidReplies(ValueError):
    """No reply parsed in `attempts` tries, or the LLM could not be reached; the message says why."""


async def ask_valid(client: Any, messages: list[dict[str, Any]], parse: Callable[[str], T], *, attempts: int,
                    what: str, expected: str, temperature: float, max_tokens: int) -> T:
    """`parse(reply)` of the first reply that parses. `what` names the asker in logs; `expected` the reply's
    kind in messages ("skill list"). Raises InvalidReplies."""
    from core.llm import LLMError  # the LLM stack is imported only when an LLM is configured

    messages = list(messages)
    error = "no attempt made"
    for attempt in range(1, attempts + 1):
        try:
            replies = await client.chat(messages, temperature=temperature, max_tokens=max_tokens, n=1)
        except LLMError as e:
            raise InvalidReplies(f"the LLM could not be reached: {e}") from e
        reply = replies[0] if replies else ""
        try:
            return parse(reply)
        except ValueError as e:
            error = str(e)
            log.warning("%s: invalid reply (attempt %d/%d): %s", what, attempt, attempts, e)
        messages += [{"role": "assistant", "content": reply[:4000]},
                     {"role": "user", "content": f"That reply was rejected: {error}. Reply with ONLY the corrected "
                                                 f"{expected}."}]
    raise InvalidReplies(f"no valid {expected} after {attempts} attempts: {error}")
