"""Which requests without `X-Turn-Type` are an agent's side requests: the auxiliary calls real agents make
besides their main loop (conversation titles, summaries for compaction, "next speaker" checks, prompt
suggestions, tool-call safety classifiers, memory reviews). A side turn is served like any request but
gets no skills or memory, is never stored, scored or trained on, and is not a conversation's next state
(serve/proxy.py `_record`).

Two signals, both from the agents' own traffic (docs/agents.md "Side requests", recorded from the agents
in interactive use, tests/integration/test_agents_live.py):
- a phrase of the agent's own auxiliary prompt, where the agent puts it: at the start of a system text
  (an Anthropic `system` block, or a system/developer message before the first user message; the
  Responses route passes `instructions` as the leading system message), or at the start of a line of the
  last user message's text. Not anywhere in it: a user who pastes or @-mentions a text quoting the phrase
  (this file, say) is still the main loop, and tool results are never read.
- a model name the operator reserved for side requests (`proxy.side_models`), for agents whose auxiliary
  model can be set apart (Claude Code's `ANTHROPIC_SMALL_FAST_MODEL` names the model of its titles).
  Clawray serves any unknown model id as the policy (serve/adapters.py `resolve`), so such a name needs
  nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from core.text import text_parts

# The opening phrase of each auxiliary prompt seen in the agents' interactive traffic (docs/agents.md has
# the request each comes from). Kept short: enough to be the agent's own words, not a whole prompt.
AGENT_SIDE_MARKERS: tuple[str, ...] = (
    # Claude Code 2.1.332: conversation compaction (/compact, automatic and idle compaction), in the last
    # user message after a no-tools preamble; the session title, a system block of its own.
    "Your task is to create a detailed summary of the conversation so far",
    "You are naming a coding session so the user can pick it out of a long list of sessions",
    # Claude Code and Qwen Code: the next-prompt suggestion (the last user message on the main prompt).
    "[SUGGESTION MODE: Suggest what the user might naturally type next",
    # Codex 0.171.0: the thread title and /compact, each the last user message.
    "Generate a concise, single-line task title",
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
    # Qwen Code 0.24.4: the session title, the auto-mode tool-call classifier, chat compression (as the
    # last user message on the main prompt, then as its own system prompt), the tool-use summary label,
    # the next-speaker check.
    "Generate a concise, sentence-case title (3-7 words) that captures what this programming-assistant session",
    "You are a security classifier for an AI coding agent operating in auto mode",
    "You are the component that summarizes a conversation when its context window is about to overflow",
    "Write a short summary label describing what these tool calls accomplished",
    "Analyze *only* the content and structure of your immediately preceding response",
    # Hermes Agent 0.19.0: the session title, context compression, the background memory/skill review.
    "Generate a short, descriptive title (3-7 words) for a conversation that starts with the following exchange",
    "You are a summarization agent creating a context checkpoint",
    "Review the conversation above and update two things:",
    "Review the conversation above and consider saving to memory if appropriate.",
    "Review the conversation above and update the skill library.",
    # OpenClaw 2026.9.6: the memory flush before compaction, and the compaction summary.
    "Pre-compaction memory flush.",
    "You are a context summarization assistant.",
    # CoPaw 1.0.2 (its memory manager, ReMe 0.3.1.8's prompts; in English, or in Chinese with the agent's
    # language `zh`, CoPaw's default): the compaction summary (/compact, automatic compaction), its own
    # system prompt; the memory summary written to memory/ that runs beside each compaction, a line of the
    # last user message after the transcript (its system prompt is "You are a helpful assistant.").
    "You are a context compaction assistant.",
    "你是一个上下文压缩助手。",
    "Memory Pre-compression Flush Cycle.",
    "预压缩内存刷新轮次。",
    # CoPaw 1.0.2's console: the image and video support probes when a model is made active (the only
    # user message, its text part after the image / video), and the skill editor's "AI optimize" (the
    # system prompt, in the console's language: en, zh, ru).
    "What is the single dominant color of this image? Reply with ONLY the color name, nothing else.",
    "What is the single dominant color shown in this video? Reply with ONLY the color name, nothing else.",
    "You are an AI skill optimization expert.",
    "你是AI技能优化专家。",
    "Вы эксперт по оптимизации AI-навыков.",
)


@dataclass(frozen=True)
class SideRules:
    """What makes a request without X-Turn-Type a side request."""

    markers: tuple[str, ...] = AGENT_SIDE_MARKERS
    models: frozenset[str] = frozenset()

    @classmethod
    def build(cls, markers: Sequence[str] | None = None, extra: Sequence[str] = (),
              models: Iterable[str] = ()) -> SideRules:
        """`markers`: replaces the built-in ones (None keeps them); `extra`: added to them
        (`proxy.side_markers`, `proxy.extra_side_markers`, `proxy.side_models`)."""
        base = AGENT_SIDE_MARKERS if markers is None else tuple(markers)
        return cls(tuple(k for k in (*base, *extra) if k), frozenset(m for m in models if m))


DEFAULT_RULES = SideRules()


def system_texts(body: dict[str, Any], messages: list[dict[str, Any]]) -> list[str]:
    """Anthropic's `system` (each block), then each system/developer message before the first user one."""
    out = text_parts(body.get("system"))
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer"):
            break
        out += text_parts(m.get("content"))
    return out


def last_user_texts(messages: list[dict[str, Any]]) -> list[str]:
    last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
    return text_parts(last.get("content")) if last is not None else []


def _starts_a_line(text: str, marker: str) -> bool:
    at = text.find(marker)
    while at != -1:
        if not text[:at].strip(" \t") or text[:at].rstrip(" \t").endswith("\n"):
            return True
        at = text.find(marker, at + 1)
    return False


def side_reason(body: dict[str, Any], messages: list[dict[str, Any]], rules: SideRules = DEFAULT_RULES) -> str | None:
    """Why this request is an agent's side request (the marker or `model:<name>`), or None: main.

    `messages`: the conversation as chat messages (the Responses route's view, serve/responses.py)."""
    model = body.get("model")
    if isinstance(model, str) and model in rules.models:
        return f"model:{model}"
    for text in system_texts(body, messages):
        head = text.lstrip()
        if (k := next((k for k in rules.markers if head.startswith(k)), None)) is not None:
            return k
    for text in last_user_texts(messages):
        if (k := next((k for k in rules.markers if _starts_a_line(text, k)), None)) is not None:
            return k
    return None
