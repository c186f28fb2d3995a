"""Context management (pure): a conversation that outgrows the model's context is fitted, not refused.

Real agents' sessions grow past any context: tool results (files read, command output) pile up. Before
skills and memory are injected, the Proxy (serve/context_manager.py) fits the request's conversation into
its `Budget`: the context length minus the reply's room minus a reserve for injection. In this order,
each step only while the conversation is still too long:

1. shorten the oldest tool results: the body becomes a marker naming how many tokens were cut; the
   element stays, with its tool-call id, so every call keeps its result (chat templates need the pair);
2. drop the oldest whole turns (a user message and everything up to the next one);
3. drop the oldest steps of the latest turn (an assistant message with the tool results that answer it),
   keeping its user message: a single long agent task keeps its task and its latest work; the same for
   the earlier turn that holds the pending exchange (a finished task the user follows up on);
4. where dropping made room, give shortened results that were kept back whole, newest first.
The pending turn's exchange (the messages the previous reply answered, and that reply) is shortened and
dropped only after everything older: the session store finds the previous turn, and its next state,
through it (serve/history.py), so a fitted session stays linked unless only the latest input fits.

Never touched: the system prompt (leading system/developer messages; Anthropic `system`, Responses
`instructions`), the tools, the latest input (after the last assistant message). What does not fit the
context even then is refused with a 400 naming the numbers.

Shapes: `openai` (chat messages; tool results are `role: tool`), `anthropic` (tool results are
`tool_result` blocks in user messages, tool calls `tool_use` blocks) and `responses` (Responses input
items: `*_output` items are results, calls and reasoning are the model's). Token counts are estimates from
the served model's tokenizer plus template overheads (`element_tokens`), set to over-count the tiny
model's chat template (tests/integration/test_serve_context.py checks them against vLLM's prompt ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from memory.budget import TokenCounter
from serve.turns import RequestError

SHAPES = ("openai", "anthropic", "responses")
MESSAGE_OVERHEAD = 8  # role markers and separators around each element
RESULT_OVERHEAD = 8  # the wrapper a template puts around a tool result (`<tool_response>` ...)
CALL_OVERHEAD = 24  # the wrapper around a tool call (`<tool_call>{"name": ..., "arguments": ...}`)
TOOLS_OVERHEAD = 64  # the tools section's instructions, plus 8 per tool
MARKER = "[clawray: {n} tokens of this tool result were removed to fit the model's context]"
OVERFLOW = ("This model's maximum context length is {context} tokens; the request does not fit even after "
            "clawray shortened every older tool result and dropped every older turn: the system prompt, the "
            "tools and the latest message(s) alone take about {tokens} tokens. Shorten the latest message.")
SYSTEM, USER, ASSISTANT, RESULT = "system", "user", "assistant", "result"
_TEXT_KEYS = ("content", "text", "output", "thinking", "summary", "refusal", "name")
_ARG_KEYS = ("arguments", "input")  # tool-call arguments: JSON text, or an object (Anthropic `tool_use`)


@dataclass(frozen=True)
class Budget:
    """Tokens of the model's context (`context`), kept for the reply (`reply`) and for the skills and
    memory injected after fitting (`reserve`); the conversation is fitted into `limit`."""

    context: int
    reply: int
    reserve: int = 0

    @property
    def limit(self) -> int:
        return self.context - self.reply - self.reserve


@dataclass
class Fitted:
    """`messages`: the fitted conversation (the very list given when it fitted); `record`: what was done
    (None: nothing), as stored on the turn (`Turn.context`)."""

    messages: list[Any]
    record: dict[str, Any] | None = None
    dropped: list[Any] = field(default_factory=list)  # the original elements dropped, in order


def _strings(x: Any, out: list[str]) -> int:
    """Append the text of `x` (an element, a block, a list of them) to `out`; returns its tool calls."""
    if isinstance(x, str):
        out.append(x)
        return 0
    calls = 0
    if isinstance(x, list):
        for y in x:
            calls += _strings(y, out)
    elif isinstance(x, dict):
        for k in _TEXT_KEYS:
            if k in x:
                calls += _strings(x[k], out)
        for k in _ARG_KEYS:
            if x.get(k) is not None:
                out.append(x[k] if isinstance(x[k], str) else json.dumps(x[k], ensure_ascii=False))
                calls += 1
        for k in ("function", "tool_calls"):
            if isinstance(x.get(k), (dict, list)):
                calls += _strings(x[k], out)
    return calls


def plain_text(x: Any) -> str:
    """The text in `x`, its tool calls' names and arguments included (what a summariser reads)."""
    out: list[str] = []
    _strings(x, out)
    return " ".join(out)


def text_tokens(x: Any, counter: TokenCounter) -> int:
    """Tokens of the text in `x` (a system prompt, a content, a tool result body)."""
    return counter.count(plain_text(x)) if x else 0


def kind(m: Any, shape: str) -> str:
    """SYSTEM, USER, ASSISTANT (the model's own: messages, tool calls, reasoning) or RESULT."""
    if not isinstance(m, dict):
        return USER
    if shape == "responses":
        t = m.get("type") or ("message" if "role" in m else "")
        if t != "message":
            return RESULT if t.endswith("_output") or t == "mcp_approval_response" else ASSISTANT
    role = m.get("role")
    if role in ("system", "developer"):
        return SYSTEM
    if role in ("tool", "function"):
        return RESULT
    if role == "user":
        return RESULT if shape == "anthropic" and _result_blocks(m) else USER
    return ASSISTANT


def _result_blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    content = m.get("content")
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"] \
        if isinstance(content, list) else []


def element_tokens(m: Any, shape: str, counter: TokenCounter) -> int:
    """Estimated tokens of one element as a chat template renders it (text plus overheads)."""
    out: list[str] = []
    calls = _strings(m, out)
    results = len(_result_blocks(m)) if shape == "anthropic" and isinstance(m, dict) else 0
    if not results and kind(m, shape) == RESULT:
        results = 1
    return (sum(counter.count(s) for s in out) + MESSAGE_OVERHEAD * (1 + results)
            + RESULT_OVERHEAD * results + CALL_OVERHEAD * calls)


def fixed_tokens(counter: TokenCounter, system: Any = None, tools: Any = None) -> int:
    """Tokens of what is never fitted: a system prompt outside the messages and the tool definitions."""
    n = text_tokens(system, counter) + MESSAGE_OVERHEAD if system else 0
    if tools:
        n += counter.count(json.dumps(tools, ensure_ascii=False)) + TOOLS_OVERHEAD + 8 * len(tools)
    return n


def conversation_tokens(messages: list[Any], shape: str, counter: TokenCounter, system: Any = None,
                        tools: Any = None) -> int:
    """Estimated prompt tokens of a whole request."""
    return fixed_tokens(counter, system, tools) + sum(element_tokens(m, shape, counter) for m in messages)


def shorten(m: dict[str, Any], shape: str, counter: TokenCounter) -> dict[str, Any]:
    """`m` (a tool result) with its body replaced by the marker; ids, names and error flags kept."""
    def marker(body: Any) -> str:
        return MARKER.format(n=text_tokens(body, counter))

    if shape == "responses":
        return {**m, "output": marker(m.get("output"))}
    if shape == "anthropic" and m.get("role") == "user":
        return {**m, "content": [{**b, "content": marker(b.get("content"))}
                                 if isinstance(b, dict) and b.get("type") == "tool_result" else b
                                 for b in m["content"]]}
    return {**m, "content": marker(m.get("content"))}


def _spans(start: int, end: int, opener: Any) -> list[tuple[int, int]]:
    """[start, end) cut before every index where `opener(i)`; the first span always begins at `start`."""
    cuts = [start] + [i for i in range(start + 1, end) if opener(i)]
    return list(zip(cuts, [*cuts[1:], end], strict=True))


def _exchange_start(kinds: list[str], head: int, last: int) -> int:
    """Where the messages answered by the assistant run that ends at `last` begin."""
    i = last
    while i > head and kinds[i - 1] == ASSISTANT:
        i -= 1
    while i > head and kinds[i - 1] != ASSISTANT:
        i -= 1
    return i


def fit(messages: list[Any], budget: Budget, counter: TokenCounter, *, shape: str = "openai",
        system: Any = None, tools: Any = None, policy: str = "trim") -> Fitted:
    """Fit `messages` into `budget.limit` (module rules). Raises RequestError(400) when the part that is
    never dropped does not fit `budget.context` at all. Elements are never modified in place."""
    if shape not in SHAPES:
        raise ValueError(f"unknown conversation shape {shape!r}; valid: {', '.join(SHAPES)}")
    costs = [element_tokens(m, shape, counter) for m in messages]
    before = fixed_tokens(counter, system, tools) + sum(costs)
    if before <= budget.limit or not messages:
        return Fitted(messages)
    kinds = [kind(m, shape) for m in messages]
    n = len(messages)
    head = next((i for i, k in enumerate(kinds) if k != SYSTEM), n)  # the leading system prompt
    last = max((i for i, k in enumerate(kinds) if k == ASSISTANT), default=-1)
    tail = min(last + 1, n - 1)  # the latest input: never shortened or dropped
    pending = _exchange_start(kinds, head, last) if last >= 0 else tail
    turns = _spans(head, n, lambda i: kinds[i] == USER)

    def steps_of(a: int, b: int) -> list[tuple[int, int]]:
        """A turn's steps: each assistant run with the results that answer it (its user message apart)."""
        first = next((i for i in range(a, b) if kinds[i] == ASSISTANT), b)
        return _spans(first, b, lambda i: kinds[i] == ASSISTANT and kinds[i - 1] != ASSISTANT) if first < b else []

    # Droppable, oldest first: whole earlier turns; the steps of the earlier turn the pending exchange is
    # in (a finished agent task the user follows up on), before that exchange; the latest turn's steps
    # but its last.
    held = next(((a, b) for a, b in turns[:-1] if a <= pending < b), None)
    units = sorted(turns[:-1] + (steps_of(*held) if held else []) + steps_of(*turns[-1])[:-1])
    kept, total, shortened, gone = list(messages), before, set(), set()

    def shorten_results(a: int, b: int) -> None:
        nonlocal total
        for i in range(a, b):
            if total <= budget.limit:
                return
            if kinds[i] == RESULT:
                short = shorten(messages[i], shape, counter)
                cost = element_tokens(short, shape, counter)
                if cost < costs[i]:
                    kept[i], total, costs[i] = short, total - costs[i] + cost, cost
                    shortened.add(i)

    def drop(spans: list[tuple[int, int]]) -> None:
        nonlocal total
        for a, b in spans:
            if total <= budget.limit:
                return
            fresh = [i for i in range(a, b) if i not in gone]  # a turn may have lost steps already
            gone.update(fresh)
            total -= sum(costs[i] for i in fresh)

    # The pending turn's exchange (what the previous reply answered, and that reply) goes last: the session
    # store links the previous turn to this request through it (serve/history.py).
    shorten_results(head, pending)  # 1. the oldest tool results
    drop([u for u in units if u[1] <= pending])  # 2. and 3. the oldest turns, then steps
    shorten_results(pending, tail)
    drop([u for u in units if u[1] > pending])
    for i in sorted(shortened - gone, reverse=True):  # dropping made room: the newest results back whole
        full = element_tokens(messages[i], shape, counter)
        if total - costs[i] + full <= budget.limit:
            kept[i], total, shortened = messages[i], total - costs[i] + full, shortened - {i}
    if total > budget.context:
        raise RequestError(OVERFLOW.format(context=budget.context, tokens=total))
    record = {"policy": policy, "limit": budget.limit, "tokens_before": before, "tokens_after": total,
              "shortened_tool_results": len(shortened - gone), "dropped_messages": len(gone)}
    return Fitted([m for i, m in enumerate(kept) if i not in gone], record,
                  [messages[i] for i in sorted(gone)])

