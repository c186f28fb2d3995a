"""Skill injection at the Proxy: retrieve skills for the last user message, put them in the system prompt.

Uses the skills plane's read side (`evolve.retrieval.SkillSearch`) in-process — the one deliberate
cross-plane import (DESIGN.md): a hop per request would cost more than the retrieval. A new skill
generation is picked up without a restart: `refresh()` re-reads the library at most every
`skills.refresh_s` seconds (cheap when nothing changed), in every replica. The skills and the generation
recorded on the turn come from one snapshot of the library (`SkillSearch.lookup`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from core.config import SkillsConfig

log = logging.getLogger("clawray.injection")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return _text(m.get("content"))
    return ""


def add_to_system(body: dict[str, Any], block: str, anthropic: bool) -> None:
    """Append `block` to the system prompt (OpenAI: first system message; Anthropic: `system`)."""
    if anthropic:
        system = body.get("system")
        if isinstance(system, list):
            body["system"] = [*system, {"type": "text", "text": block}]
        else:
            body["system"] = f"{system}\n\n{block}" if system else block
        return
    msgs = body["messages"]
    first = msgs[0] if msgs else None
    if first is not None and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, list):
            first = {**first, "content": [*content, {"type": "text", "text": block}]}
        else:
            first = {**first, "content": f"{content}\n\n{block}" if content else block}
        body["messages"] = [first, *msgs[1:]]
    else:
        body["messages"] = [{"role": "system", "content": block}, *msgs]


class SkillInjector:
    def __init__(self, search: Any, cfg: SkillsConfig):
        self.search, self.cfg = search, cfg

    @classmethod
    def build(cls, cfg: SkillsConfig, skills_dir: Path) -> SkillInjector | None:
        if not cfg.enabled:
            return None
        from evolve.bank import SkillBank
        from evolve.retrieval import SkillSearch

        skills_dir.mkdir(parents=True, exist_ok=True)
        return cls(SkillSearch(SkillBank(skills_dir, cfg), cfg), cfg)

    def start(self) -> None:
        pass  # refresh is driven by requests (time-gated), so an idle replica does no work

    async def inject(self, body: dict[str, Any], anthropic: bool) -> tuple[list[str], int]:
        """Inject into `body` in place; returns (injected skill names, skill generation)."""
        from evolve.retrieval import render_skills_block

        query = last_user_text(body.get("messages") or [])
        if self.cfg.retrieval == "embedding":  # query encoding is CPU work: keep it off the loop
            skills, generation = await asyncio.to_thread(self._retrieve, query)
        else:
            skills, generation = self._retrieve(query)
        if skills:
            add_to_system(body, render_skills_block(skills), anthropic)
        return [s.name for s in skills], generation

    def _retrieve(self, query: str) -> tuple[list, int]:
        """(skills, their generation) from ONE library snapshot: a refresh landing between two separate
        reads would pair one library's skills with another's generation (issue 12 item 8)."""
        self.search.refresh()
        if not query:
            return [], self.search.generation  # nothing injected: any current generation is the truth
        return self.search.lookup(query)
