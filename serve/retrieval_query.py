"""What a turn's skills and memories are retrieved for: the user's own latest words, not what the agent wraps
around them or the tool results it sends back.

Real agents do not send "the last user message" as the user typed it (tests/unit/agent_side_requests.jsonl,
recorded from each agent in interactive use):
- Claude Code (the Anthropic API) sends each tool's output back as a user message of `tool_result` blocks
  only; the turns of an agent's tool loop have no user text at all. Read as the query, that empty text
  retrieved nothing: the skills vanished from every turn after the first tool call, and with them the
  system prompt's tail, so the engine's prefix cache missed from there on each time.
- Claude Code and Qwen Code put `<system-reminder>` parts (tool lists, the date, attribution rules, the
  agent's own skills list) into the user's message beside what the user typed, Claude Code also a slash
  command's caveat and output; Codex sends `<environment_context>` as a user message of its own; OpenClaw
  puts its internal context (`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`) in a user message after the user's.
  Read as the query, that text drowned (or, for OpenClaw, replaced) what the user asked.

So the query is the text of the latest user message that has any text besides such parts: each text part
(or a string content) that starts with one of `AGENT_CONTEXT_MARKERS` is left out, tool results are no
text, and a message with nothing left is passed over for the one before it. Within a tool loop every turn
then retrieves for the same instruction: the same skills, the same system prompt, a prefix the engine can
reuse. The markers are the agents' own opening tags, matched at the start of a part only: a user who
quotes one mid-sentence is still heard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The opening tag of each context part seen in the agents' interactive traffic (tests/unit/agent_side_requests.jsonl).
AGENT_CONTEXT_MARKERS: tuple[str, ...] = (
    # Claude Code 2.1.332 and Qwen Code 0.24.4: reminders in the user's message (tools, date, skills, rules).
    "<system-reminder>",
    # Claude Code: a slash command run locally, echoed into the next message (/compact, say).
    "<local-command-caveat>",
    "<command-name>",
    "<local-command-stdout>",
    # Codex 0.171.0: the working directory, shell and sandbox, a user message before the user's own.
    "<environment_context>",
    # OpenClaw 2026.9.6: conversation metadata, a user message after the user's own.
    "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>",
)


def context_markers(markers: Sequence[str] | None = None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """`markers` replaces the built-in ones (None keeps them); `extra` is added (`proxy.retrieval_skip_markers`,
    `proxy.extra_retrieval_skip_markers`)."""
    base = AGENT_CONTEXT_MARKERS if markers is None else tuple(markers)
    return tuple(m for m in (*base, *extra) if m)


def _own_texts(content: Any, markers: tuple[str, ...]) -> list[str]:
    if isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = [t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str)]
    else:
        return []
    return [t for t in parts if t.strip() and not t.lstrip().startswith(markers)]


def retrieval_query(messages: Any, markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> str:
    """The user's own text of the latest user message that has any ("" when none does)."""
    if not isinstance(messages, list):
        return ""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user" and (texts := _own_texts(m.get("content"), markers)):
            return " ".join(texts)
    return ""
