"""The judge prompt: instruction, the response with its tool calls, and the next state.

The next state (the user's follow-up, tool results, environment feedback) is where the evidence of
success or failure is, so it is shown unless configured off. A reply cut by `max_tokens` is followed by
`TRUNCATED_NOTE` (the rule is rewards/scoring.py's). Every part is sanitized (reasoning
blocks and chat-template special tokens confuse judges and trip content filters) and capped by a
token budget shared across the parts (`allocate`), counted with an injected `TokenCounter`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from core.agent_context import AGENT_CONTEXT_MARKERS, latest_user_request
from core.contracts import Turn
from rewards.tokens import Keep, TokenCounter

JUDGE_SYSTEM = (
    "You review one turn of an AI assistant working for a user.\n"
    "You see the instruction (with the assistant's system context), the assistant's response "
    "including any tool calls, and {evidence}.\n"
    "Use +1 when the response correctly and substantially completes the instruction.\n"
    "Use -1 when it is wrong, off-task, unsafe, or fails core requirements{evidence_rule}.\n"
    "Use 0 when the evidence is insufficient to tell.\n"
    "Think briefly, then end your reply with exactly one line: Score: 1, Score: 0 or Score: -1"
)
EVIDENCE_NEXT = "the next state: what happened right after it (the user's follow-up, tool results, feedback)"
RULE_NEXT = (
    "; a user correcting or repeating the request, a failing tool result, or negative feedback in "
    "the next state is strong evidence of failure"
)

# Said after a reply cut by max_tokens (rewards/scoring.py: such turns are scored as they are).
TRUNCATED_NOTE = ("[The response was cut off here: it reached the max_tokens limit. Judge what it "
                  "produced; an answer left unfinished does not complete the instruction.]")

# Shares of the token budget (unused shares flow to the parts that need more, see `allocate`).
WEIGHTS = {"system": 0.15, "instruction": 0.25, "response": 0.35, "next_state": 0.25}
# Which end of a part survives truncation: a system prompt states its rules first; the request is
# usually at the end of a long user message; a response's verdict-relevant parts are at both ends;
# feedback leads with the verdict.
KEEP: dict[str, Keep] = {"system": "head", "instruction": "tail", "response": "middle", "next_state": "head"}

THINK_RE = re.compile(r"<think>.*?</think>", re.S | re.I)
SPECIAL_RE = re.compile(
    r"<\|[A-Za-z0-9_.:-]{1,40}\|>|</?s>|\[/?INST\]|<<\/?SYS>>|<(?:start|end)_of_turn>|<\|?eot_id\|?>"
)
TOOL_TAG_RE = re.compile(r"</?tool_call>", re.I)
CTRL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def sanitize(text: str) -> str:
    """Strip `<think>` blocks (closed ones; a lone `</think>` ends a block opened in the prompt; an
    unclosed `<think>` runs to the end), chat special tokens (`<|im_start|>`, `</s>`, `[INST]`, ...),
    `<tool_call>` tags (their content is kept) and control characters."""
    text = THINK_RE.sub("", text or "")
    if re.search(r"</think>", text, re.I):
        text = re.split(r"</think>", text, flags=re.I)[-1]
    m = re.search(r"<think>", text, re.I)
    if m:
        text = text[: m.start()] + "[unfinished reasoning omitted]"
    text = SPECIAL_RE.sub("", text)
    text = TOOL_TAG_RE.sub("", text)
    return CTRL_RE.sub("", text).strip()


def message_text(msg: dict[str, Any]) -> str:
    """The text of an OpenAI/Anthropic message: a string, or the text parts of a content list."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, dict) and p.get("type") == "tool_result":  # Anthropic
                parts.append(message_text({"content": p.get("content")}))
            elif isinstance(p, dict):
                parts.append(f"[{p.get('type', 'part')}]")
        return "\n".join(parts)
    return ""


def render_tool_calls(tool_calls: list[dict[str, Any]]) -> str:
    lines = []
    for call in tool_calls or []:
        fn = call.get("function", call)  # OpenAI {"function": {...}} or a flat {"name", "arguments"}
        args = fn.get("arguments", fn.get("input", ""))
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        lines.append(f"[tool call] {fn.get('name', '?')}({args})")
    return "\n".join(lines)


def render_messages(messages: list[dict[str, Any]]) -> str:
    """`[role] text` lines; tool results name their tool; assistant tool calls are rendered."""
    lines = []
    for m in messages:
        role = m.get("role", "?")
        label = f"tool result {m['name']}" if role == "tool" and m.get("name") else role
        text = message_text(m)
        if text:
            lines.append(f"[{label}] {text}")
        if m.get("tool_calls"):
            lines.append(render_tool_calls(m["tool_calls"]))
    return "\n".join(lines)


def turn_parts(turn: Turn, use_next_state: bool,
               markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> dict[str, str]:
    """The judge-visible parts of a turn, sanitized, before budgeting. `markers`: what in a user message is
    the agent's, not the user's words (core/agent_context.py)."""
    msgs = turn.messages
    system = "\n".join(message_text(m) for m in msgs if m.get("role") in ("system", "developer"))
    # The instruction is the user's latest request plus what followed it inside this request (the
    # assistant's earlier tool calls and their results in an agent loop): the latest user message with
    # words of the user's own, not Claude Code's tool results (user messages of `tool_result` blocks) nor an
    # agent's context message after it (OpenClaw's); the last user message when none has any.
    found = latest_user_request(msgs, markers)
    start = found[0] if found else max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    tail = [] if start is None else msgs[start:]
    instruction = render_messages(tail) if len(tail) > 1 else (message_text(tail[0]) if tail else "")
    response = "\n".join(x for x in (turn.response_text, render_tool_calls(turn.tool_calls)) if x)
    parts = {"system": system, "instruction": instruction, "response": response}
    if use_next_state:
        parts["next_state"] = render_messages(turn.next_state) if turn.next_state else ""
    return {k: sanitize(v) for k, v in parts.items()}


def allocate(needs: dict[str, int], budget: int, weights: dict[str, float]) -> dict[str, int]:
    """Split `budget` tokens over parts needing `needs[k]`: parts under their weighted share get all
    they need and the rest is re-shared by weight among the others (water-filling).

    Invariants: out[k] <= needs[k]; sum(out) <= budget; out == needs when sum(needs) <= budget.
    """
    out = {k: 0 for k in needs}
    open_parts = {k for k, n in needs.items() if n > 0}
    left = budget
    while open_parts and left > 0:
        total_w = sum(weights.get(k, 1.0) for k in open_parts)
        shares = {k: int(left * weights.get(k, 1.0) / total_w) for k in open_parts}
        satisfied = {k for k in open_parts if needs[k] - out[k] <= shares[k]}
        if not satisfied:
            for k in open_parts:
                out[k] += shares[k]
            break
        for k in satisfied:
            left -= needs[k] - out[k]
            out[k] = needs[k]
        open_parts -= satisfied
    return out


def build_judge_messages(
    turn: Turn, *, tokens: TokenCounter, budget: int, use_next_state: bool = True,
    markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS,
) -> list[dict[str, str]]:
    """The chat messages asking a judge to score `turn` (system + one user message).

    Args:
        turn: the captured turn (messages, response text and tool calls, next state).
        tokens: counts and truncates text in the judge's tokens.
        budget: total tokens for the turn's parts (the fixed instructions around them are extra).
        use_next_state: show what followed the turn (config `rewards.use_next_state`).
        markers: what in a user message is the agent's (`proxy.agent_context_markers`, core/agent_context.py).
    """
    parts = turn_parts(turn, use_next_state, markers)
    needs = {k: tokens.count(v) for k, v in parts.items()}
    caps = allocate(needs, budget, WEIGHTS)
    cut = {k: tokens.truncate(v, caps[k], KEEP[k]) if needs[k] > caps[k] else v for k, v in parts.items()}
    if use_next_state:
        system = JUDGE_SYSTEM.format(evidence=EVIDENCE_NEXT, evidence_rule=RULE_NEXT)
    else:
        system = JUDGE_SYSTEM.format(evidence="nothing of what followed", evidence_rule="")
    response = cut["response"] or "(empty response)"
    if turn.truncated:  # outside the budget: the judge must know the end is missing, not chosen
        response += f"\n\n{TRUNCATED_NOTE}"
    sections = [
        ("Assistant's system context", cut["system"] or "(none)"),
        ("Instruction", cut["instruction"] or "(none)"),
        ("Response", response),
    ]
    if use_next_state:
        sections.append(("Next state", cut["next_state"] or "(none: nothing followed this turn)"))
    body = "\n\n".join(f"## {title}\n{text}" for title, text in sections)
    body += "\n\nWas the response good? End with Score: 1, Score: 0 or Score: -1."
    return [{"role": "system", "content": system}, {"role": "user", "content": body}]
