"""The collective job's decisions by an LLM (`evolver.collective.llm`, else `evolver.llm`), offline otherwise.

`LLMDecider.decide` shows the model one group: the skill's current SKILL.md (or "no skill"), each session's
trajectory (its turns: instruction, reply, what followed, score; capped) and the offline decision as a
baseline, and asks for ONE JSON object: {"action", "name", "description", "category", "body", "summary"}.
The reply is validated (pydantic; a refine or description change must keep the group's name, a create
must not take an existing one; `summary` must say what was kept, what changed and why) and retried with the
error; a model that cannot produce a valid decision after `max_attempts` leaves the offline decision in
place, recorded as such. Whatever it decides still has to pass the validation gate.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.contracts import SKILL_NAME_RE, Skill
from evolve.collective import NO_SKILL, Decision, SessionSummary
from evolve.scopes import GLOBAL, scope_of
from evolve.skill_md import render_skill_md

log = logging.getLogger(__name__)
MAX_TURN_CHARS = 600
MAX_SESSIONS = 12

SYSTEM_PROMPT = """You maintain a shared library of skills (short reusable instructions injected into an AI \
agent's system prompt) from the sessions of many users. You are shown one group of sessions: those that used \
one skill (its current text is given), or those that used no skill. Decide ONE action:
  "refine": a conservative edit of the existing skill that keeps what worked (successful sessions are \
evidence too) and fixes what the failed sessions show; keep its name.
  "create": a new skill for a need that recurs across these sessions and no skill covers; a new name.
  "optimize_description": the skill's text is right but it was retrieved for the wrong tasks: rewrite only \
its description so it is used for the right ones; keep its name and body.
  "skip": nothing to change.
Reply with ONLY a JSON object with keys "action", "name" (lowercase slug, 2-64 chars), "description", \
"category", "body" (Markdown) and "summary" (what was kept, what changed, and why, in 1-3 sentences). For \
"skip" give the reason in "summary" and leave the other keys empty."""


class DecisionDraft(BaseModel):
    model_config = ConfigDict(extra="ignore")
    action: Literal["refine", "create", "optimize_description", "skip"]
    name: str = ""
    description: str = Field(default="", max_length=1024)
    category: str = "general"
    body: str = Field(default="", max_length=8000)
    summary: str = Field(min_length=10, max_length=2000)


_OBJ_RE = re.compile(r"\{.*\}", re.S)


def parse_decision(text: str, group: str, library: Sequence[Skill]) -> DecisionDraft:
    """The decision in an LLM reply; ValueError saying what is wrong."""
    m = _OBJ_RE.search(text or "")
    if m is None:
        raise ValueError("no JSON object found in the reply")
    try:
        draft = DecisionDraft.model_validate(json.loads(m.group(0)))
    except (json.JSONDecodeError, ValidationError) as e:
        raise ValueError(f"not a valid decision object: {str(e).splitlines()[0]}") from None
    names = {s.name for s in library}
    if draft.action == "skip":
        return draft
    if not SKILL_NAME_RE.fullmatch(draft.name):
        raise ValueError(f"name {draft.name!r} is not a lowercase slug of 2-64 characters")
    if draft.action == "create" and draft.name in names:
        raise ValueError(f"create must use a new name; {draft.name!r} exists")
    if draft.action != "create" and (group == NO_SKILL or draft.name != group):
        raise ValueError(f"{draft.action} must keep the group's skill name {group!r}" if group != NO_SKILL
                         else f"{draft.action} needs a skill; these sessions used none: use create or skip")
    if len(draft.description) < 10 or (draft.action != "optimize_description" and not draft.body.strip()):
        raise ValueError("description (>= 10 characters) and body are required")
    return draft


def group_prompt(group: str, sessions: Sequence[SessionSummary], library: Sequence[Skill], offline: Decision) -> str:
    skill = next((s for s in library if s.name == group), None)
    parts = ["## The skill these sessions used\n" + (f"```\n{render_skill_md(skill)}\n```" if skill else "(none)")]
    for s in list(sessions)[:MAX_SESSIONS]:
        turns = "\n".join(f"- score {e.reward:g} | task: {e.instruction[:MAX_TURN_CHARS]!r} | reply: "
                          f"{e.response[:MAX_TURN_CHARS]!r} | then: {e.feedback[:MAX_TURN_CHARS]!r}" for e in s.rows)
        parts.append(f"## Session {s.session_id} (user {s.tenant.split('/')[0]}): {s.summary}\n{turns}")
    if len(sessions) > MAX_SESSIONS:
        parts.append(f"(and {len(sessions) - MAX_SESSIONS} more sessions)")
    parts.append(f"## Other skills in the library\n{', '.join(s.name for s in library if s.name != group) or '(none)'}")
    parts.append(f"## A rule-based baseline decided: {offline.action}: {offline.summary}\n\nReply with the JSON object.")
    return "\n\n".join(parts)


class LLMDecider:
    """`decide(group, sessions, library, offline) -> Decision` (module docstring). `client`: anything with
    `core.llm.LLMClient`'s async `chat` (the configured endpoint; the engine's `EngineJudge` in tests)."""

    def __init__(self, client: Any, max_attempts: int = 3, temperature: float = 0.2, max_tokens: int = 2048):
        self.client, self.max_attempts = client, max_attempts
        self.temperature, self.max_tokens = temperature, max_tokens

    async def decide(self, group: str, sessions: Sequence[SessionSummary], library: Sequence[Skill],
                     offline: Decision) -> Decision:
        from evolve.llm_json import InvalidReplies, ask_valid

        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": group_prompt(group, sessions, library, offline)}]

        def parse(reply: str) -> Decision:
            return self._decision(parse_decision(reply, group, library), group, library, offline)

        try:
            return await ask_valid(self.client, messages, parse, attempts=self.max_attempts,
                                   what="collective LLM decider", expected="decision object",
                                   temperature=self.temperature,
                                   max_tokens=self.max_tokens)
        except InvalidReplies as e:
            error = str(e)
        offline.summary = f"{offline.summary} (the LLM decider failed: {error}; the rule-based decision stands)"
        offline.evidence = {**offline.evidence, "llm_error": error}
        return offline

    @staticmethod
    def _decision(d: DecisionDraft, group: str, library: Sequence[Skill], offline: Decision) -> Decision:
        ev = {**offline.evidence, "decider": "llm"}
        if d.action == "skip":
            return Decision(group, "skip", d.summary, evidence=ev)
        old = next((s for s in library if s.name == d.name), None)
        if d.action == "create" or old is None:
            cand = Skill(name=d.name, description=d.description, category=d.category or "general", body=d.body,
                         metadata={"source": "collective-llm", "scope": GLOBAL})
            return Decision(group, "create", d.summary, cand, 0, ev)
        body = old.body if d.action == "optimize_description" else d.body
        cand = old.model_copy(update={"description": d.description, "body": body,
                                      "metadata": {**old.metadata, "source": "collective-llm", "scope": scope_of(old)}})
        return Decision(group, d.action, d.summary, cand, offline.base_version, ev)
