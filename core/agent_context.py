"""What in a user message is the user's own words, and what an agent added to it: read one way by the
Proxy (what skills and memories are retrieved for: serve/injection.py, serve/memory_injection.py), by
memory (what a turn says the user said, memory/ingest.py), by the evolvers (the instruction a failed
turn answered, evolve/evidence.py) and by the PRM judge (where a turn's instruction starts, rewards/judge.py).

Real agents do not send the user's message as typed (tests/unit/agent_side_requests.jsonl, recorded from
each agent in interactive use): Claude Code and Qwen Code put `<system-reminder>` parts (tool lists, the
date, attribution rules, the agent's own skills list) beside what the user typed, Claude Code also a slash
command's caveat, name and output; Codex sends `<environment_context>` as a user message of its own;
OpenClaw puts its internal context (`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`) in a user message after the
user's. Tool results (Anthropic `tool_result` blocks) are no text (core/text.py). A text part, or a string
content, that starts with one of the agents' opening tags is the agent's; matched at the start of a part
only, so a user who quotes a tag mid-sentence is read as written. OpenClaw also wraps the user's own text:
a time stamp before it, and in a conversation's first user message its runtime line after it (`unwrap`).

Read as "the last user message", those requests retrieved for the wrong text: Claude Code sends each tool's
output back as a user message of `tool_result` blocks only, so the turns of its tool loop had no query at
all (no skills from the first tool call on, and with them the system prompt's tail gone, so the engine's
prefix cache missed from there); its first turn retrieved for its commit-attribution reminder as much as
for the request, Qwen Code's for four reminders, OpenClaw's for its internal context. `latest_user_words`
is the text of the latest user message that has any text of the user's own; a message with nothing left is
passed over for the one before it. Within a tool loop every turn then reads the same instruction: the same
skills, the same system prompt, a prefix the engine can reuse.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from core.text import text_parts

# The opening tag of each context part seen in the agents' interactive traffic (docs/agents.md "What skills
# and memories are retrieved for").
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


# OpenClaw 2026.9.6's wrapping of the user's own text. Before it, the time stamp it puts on every user message
# ("[Wed 2026-12-02 13:29 UTC] ": an optional weekday, the date, the time with optional seconds, a short zone
# name; its `formatZonedTimestamp`). After it, in a conversation's first user message, the runtime line it
# moves there from the system prompt so that the system prompt stays the same across conversations ("\n\n"
# + "Runtime: agent=main | session=... | os=linux (x64) | model=..."; with list content, a text part of its
# own): key=value pairs, and the message's last line.
_STAMP = re.compile(r"\[(?:[A-Z][a-z]{2} )?\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?(?: [^\]\n]{1,40})?\] ")
_RUNTIME = re.compile(r"(?:\A|\n\n)Runtime: [a-z_]+=[^\n]*\Z")


def unwrap(text: str) -> str:
    """`text` less an agent's wrapping of what the user typed (OpenClaw's time stamp and runtime line)."""
    stamp = _STAMP.match(text)
    if stamp:
        text = text[stamp.end():]
    return _RUNTIME.sub("", text) if "Runtime: " in text else text


def context_markers(markers: Sequence[str] | None = None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """`markers` replaces the built-in ones (None keeps them); `extra` is added (`proxy.agent_context_markers`,
    `proxy.extra_agent_context_markers`)."""
    base = AGENT_CONTEXT_MARKERS if markers is None else tuple(markers)
    return tuple(m for m in (*base, *extra) if m)


def own_texts(content: Any, markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> list[str]:
    """The user's own texts of a message's content: its text parts (or the string) that are neither blank
    nor an agent's context part, unwrapped (`unwrap`)."""
    texts = (unwrap(t) for t in text_parts(content) if not t.lstrip().startswith(markers))
    return [t for t in texts if t.strip()]


def latest_user_request(messages: Any, markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> tuple[int, str] | None:
    """(index, the user's own text) of the latest user message that has any; None when none does."""
    if not isinstance(messages, list):
        return None
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "user" and (texts := own_texts(m.get("content"), markers)):
            return i, " ".join(texts)
    return None


def latest_user_words(messages: Any, markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> str:
    """The user's own text of the latest user message that has any ("" when none does)."""
    found = latest_user_request(messages, markers)
    return found[1] if found else ""
