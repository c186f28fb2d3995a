"""Every agent clawray can set up, by CLI name."""

from __future__ import annotations

from agents import claude_code, codex, copaw, hermes, openclaw, qwen_code
from agents.base import Agent

AGENTS: dict[str, Agent] = {a.name: a for a in (
    openclaw.AGENT, claude_code.AGENT, codex.AGENT, copaw.AGENT, hermes.AGENT, qwen_code.AGENT,
)}


def get(name: str) -> Agent:
    try:
        return AGENTS[name]
    except KeyError:
        raise KeyError(f"unknown agent {name!r}; known: {', '.join(AGENTS)}") from None
