"""The collective job's LLM decider: replies validated and retried, the rule-based decision kept when the
model cannot decide. The model is a scripted stand-in for a hosted LLM (the real engine's answer path is in
tests/integration/test_evolve_collective.py)."""

from __future__ import annotations

import asyncio
import json

from core.contracts import Skill
from core.llm import LLMError
from evolve.collective import NO_SKILL, decide, summarise_all
from evolve.collective_llm import LLMDecider, parse_decision
from evolve.evidence import Evidence

SKILL = Skill(name="boxed-answers", description="Box the final option letter.", body="Use \\boxed{X}.",
              metadata={"scope": "group:team", "version": 3})
LESSON = "[Feedback] You must prefer option C when the question is about backups."


class Scripted:
    def __init__(self, *replies):
        self.replies, self.calls = list(replies), []

    async def chat(self, messages, **kw):
        self.calls.append(messages)
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return [r]


def sessions():
    return summarise_all([Evidence(turn_id="t1", session_id="s1", tenant="alice/w", reward=-1.0, skills=[SKILL.name],
                                   instruction="backup quiz", feedback=LESSON)])


def reply(**kw) -> str:
    base = {"action": "refine", "name": SKILL.name, "description": "Box the final option letter; prefer C for backups.",
            "category": "general", "body": "Use \\boxed{X}.\n- Prefer C for backup questions.",
            "summary": "kept the boxing rule; added the backup preference the failed session showed"}
    return "Here you go:\n```json\n" + json.dumps({**base, **kw}) + "\n```"


def run(client, group=SKILL.name, library=(SKILL,)):
    s = sessions()
    offline = decide(group, s, list(library))
    return asyncio.run(LLMDecider(client).decide(group, s, list(library), offline)), offline


def test_a_valid_refinement_keeps_the_skills_name_and_scope():
    d, _ = run(Scripted(reply()))
    assert d.action == "refine" and d.candidate.body.endswith("backup questions.")
    assert d.candidate.metadata["scope"] == "group:team" and d.evidence["decider"] == "llm"
    assert d.summary.startswith("kept the boxing rule")


def test_an_invalid_reply_is_retried_with_the_error_then_the_rule_based_decision_stands():
    client = Scripted("not json", reply(name="another-name"), reply())
    d, _ = run(client)
    assert d.action == "refine" and len(client.calls) == 3
    assert "must keep the group's skill name" in client.calls[2][-1]["content"]
    d, offline = run(Scripted("{}", "{}", "{}"))
    assert d is offline and "the LLM decider failed" in d.summary and d.action == "refine"
    d, _ = run(Scripted(LLMError("timed out", retryable=True)))
    assert "could not be reached" in d.evidence["llm_error"]


def test_create_needs_a_new_name_and_skip_needs_only_a_reason():
    assert parse_decision(reply(action="skip", name="", body="", description=""), SKILL.name, [SKILL]).action == "skip"
    d, _ = run(Scripted(reply(action="create", name="backup-preferences")), group=NO_SKILL)
    assert d.action == "create" and d.base_version == 0 and d.candidate.metadata["scope"] == "global"
    for bad, why in [(reply(action="create"), "new name"), (reply(name="Bad Name"), "slug"),
                     (reply(action="refine", name=SKILL.name), "used none")]:
        try:
            parse_decision(bad, NO_SKILL if why == "used none" else SKILL.name, [SKILL])
        except ValueError as e:
            assert why in str(e)
        else:
            raise AssertionError(f"accepted: {bad}")
