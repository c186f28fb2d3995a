"""Output-token limits (pure): what a request asks for, and keeping that ask within the model's context.

Real agents ask for more output than a small context holds (Claude Code asks for 32,000 tokens; the CPU
engine's context is 2,048), and vLLM refuses a limit above the context length outright. With
`engine.clamp_max_tokens` (default on) the engine lowers such a limit to its context length
(`clamp_output_request`, serve/vllm_engine.py) before vLLM sees the request; vLLM's serving layer then
grants `min(limit, context - rendered prompt)` (its `get_max_tokens`), the prompt as rendered, with the
skills and memory the Proxy injected. The turn records both numbers: `max_tokens_requested` (the client's
ask, read by the Proxy) and `max_tokens_granted` (the `max_tokens` of the sampling parameters the engine
ran, serve/capture.py). `engine.max_output_tokens` (default none) also caps every request's output,
asked or not (`cap_output_request`): an operator's bound on the time and memory one reply may take.

A prompt that leaves no room at all is a 400 naming the numbers: vLLM's own message when the prompt is
longer than the context, `context_full_message` when it takes the context exactly (vLLM would report
only "max_tokens must be at least 1").
"""

from __future__ import annotations

from typing import Any

# Per client API (serve/apis.py), its output-token limit fields in vLLM's order of precedence.
OUTPUT_FIELDS = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "messages": ("max_tokens",),
    "responses": ("max_output_tokens",),
}


def _limit(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def requested_output_tokens(body: dict[str, Any], fields: tuple[str, ...]) -> int | None:
    """The output-token limit `body` asks for: the first of `fields` it sets (None: it names none).
    `fields` in vLLM's order of precedence (chat: `max_completion_tokens` before `max_tokens`)."""
    for name in fields:
        value = _limit(body.get(name))
        if value is not None:
            return value
    return None


def clamp_output_request(body: dict[str, Any], fields: tuple[str, ...], context_len: int) -> None:
    """Lower every limit in `fields` that exceeds `context_len` to it, in place (the engine then grants
    what the rendered prompt leaves). Limits within the context, and non-integers, are left as sent."""
    for name in fields:
        value = _limit(body.get(name))
        if value is not None and value > context_len:
            body[name] = context_len


def cap_output_request(body: dict[str, Any], fields: tuple[str, ...], cap: int) -> None:
    """`engine.max_output_tokens`: every limit in `fields` above `cap` lowered to it, and a request that
    names none (the engine would grant all the context leaves) given `cap` in the API's first field, in
    place. A limit within the cap, and a non-integer (vLLM's validation refuses it), are left as sent."""
    named = False
    for name in fields:
        value = _limit(body.get(name))
        if value is not None:
            named = True
            if value > cap:
                body[name] = cap
        elif body.get(name) is not None:
            named = True
    if not named:
        body[fields[0]] = cap


def context_full_message(context_len: int) -> str:
    """The 400 for a prompt that takes the whole context (injected skills and memory included)."""
    return (f"This model's maximum context length is {context_len} tokens and the prompt (with the skills "
            f"and memory clawray injected) takes all {context_len} of them: no output token fits. "
            "Shorten the conversation.")
