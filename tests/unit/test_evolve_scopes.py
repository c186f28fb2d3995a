"""Skill scopes: who a skill is served to, what the fast loop writes a lesson at, promotion through the gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.config import CollectiveConfig, EvolverConfig, GateConfig, SkillsConfig
from core.contracts import Sample, Skill, Turn
from core.kv import KVStore
from evolve.bank import SkillBank
from evolve.collective_job import CollectiveJob
from evolve.evidence import Evidence, EvidenceStore
from evolve.evolvers import FeedbackEvolver
from evolve.gate import Validator
from evolve.loop import EvolutionLoop
from evolve.retrieval import SkillSearch
from evolve.scopes import (
    check_scope,
    private_name,
    request_scopes,
    scope_of,
    split_by_scope,
    tenant_scope,
    visible,
)
from rewards.checkers import evaluate
from tests.unit.test_invariant_skill_generation_snapshot import HashEmbedder

FEEDBACK = "[Previous Feedback] You must create config.json.bak before modifying config.json."
GROUPS = {"team": ["alice", "bob"], "ops": ["carol"]}


def sk(name: str, scope: str | None, text: str = "modify config json backup") -> Skill:
    return Skill(name=name, description=f"{text} ({name})", body=text, metadata={"scope": scope} if scope else {})


def test_scope_helpers():
    assert tenant_scope("alice/proj", "user") == "user:alice"
    assert tenant_scope("alice/proj", "workspace") == "workspace:alice/proj"
    assert tenant_scope("alice/proj", "global") == "global"
    assert tenant_scope("bob/x", "group", GROUPS) == "group:team" and tenant_scope("zed/x", "group", GROUPS) == "user:zed"
    assert request_scopes("alice/proj", GROUPS) == {"user:alice", "workspace:alice/proj", "group:team"}
    assert request_scopes("mallory/proj", GROUPS) == {"user:mallory", "workspace:mallory/proj"}
    assert scope_of(sk("aa", None)) == "global" and visible(sk("aa", None), frozenset())
    assert not visible(sk("aa", "user:alice"), request_scopes("bob/proj", GROUPS))
    shared, private, bad = split_by_scope([sk("gg", None), sk("pp", "user:alice"), sk("xx", "everyone"), sk("yy", "user:")])
    assert [s.name for s in shared] == ["gg"] and list(private) == ["user:alice"] and bad == ["xx", "yy"]
    assert private_name("lesson", "user:bob", ["other"]) == "lesson"
    assert private_name("lesson", "user:bob", ["lesson"]).startswith("lesson-")
    with pytest.raises(ValueError, match="invalid skill scope"):
        check_scope("user:a/b")
    assert check_scope("user:bob smith") == "user:bob smith"  # user ids may hold spaces
    assert check_scope("workspace:bob/proj/sub") == "workspace:bob/proj/sub"


@pytest.mark.parametrize("retrieval", ["template", "embedding"])
def test_a_request_sees_the_global_skills_and_its_own_scopes_only(tmp_path, retrieval):
    cfg = SkillsConfig(retrieval=retrieval, groups=GROUPS, refresh_s=0.001)
    bank = SkillBank(tmp_path, cfg)
    for s in [sk("shared-one", None), sk("alice-own", "user:alice"), sk("alice-proj", "workspace:alice/proj"),
              sk("team-skill", "group:team"), sk("typo-scope", "users:alice")]:
        bank.add(s)
    search = SkillSearch(bank, cfg, HashEmbedder() if retrieval == "embedding" else None)

    def seen(tenant: str | None) -> set[str]:
        scopes = request_scopes(tenant, GROUPS) if tenant else None
        return {s.name for s in search.retrieve("modify the config json with a backup", scopes=scopes)}

    assert seen("alice/proj") == {"shared-one", "alice-own", "alice-proj", "team-skill"}
    assert seen("alice/other") == {"shared-one", "alice-own", "team-skill"}
    assert seen("bob/proj") == {"shared-one", "team-skill"}
    assert seen("mallory/proj") == {"shared-one"}  # an adversarial id sees nothing private
    assert seen("alice/proj/..") == {"shared-one", "alice-own", "team-skill"}
    assert seen(None) == {"shared-one"}
    own = search.retrieve("modify the config json with a backup", scopes=request_scopes("alice/proj", GROUPS))
    assert [s.name for s in own][:3] == sorted(["alice-own", "alice-proj", "team-skill"], key=[s.name for s in own].index)


def turn(tenant: str, sid: str, feedback: str = FEEDBACK) -> tuple[Turn, Sample]:
    t = Turn(session_id=sid, turn_index=0, tenant=tenant, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
             messages=[{"role": "user", "content": "Please modify config.json to set debug=true"}],
             response_text="Done.", next_state=[{"role": "user", "content": feedback}])
    return t, Sample.from_turn(t, reward=-1.0, trainable=True)


def test_the_fast_loop_writes_a_lesson_for_its_users_scope_only(tmp_path: Path):
    bank = SkillBank(tmp_path, SkillsConfig(groups=GROUPS))
    loop = EvolutionLoop(bank, EvolverConfig(), FeedbackEvolver())
    a = asyncio.run(loop.observe(*turn("alice/p", "s1")))
    assert a is not None and len(a.accepted) == 1
    alice = bank.get(a.accepted[0])
    assert scope_of(alice) == "user:alice"
    b = asyncio.run(loop.observe(*turn("mallory/p", "s2")))  # the same lesson from another user
    (name,) = b.accepted
    assert name != alice.name and scope_of(bank.get(name)) == "user:mallory"
    assert bank.get(alice.name) == alice  # alice's skill is untouched

    team = SkillBank(tmp_path / "team", SkillsConfig(groups=GROUPS))
    loop = EvolutionLoop(team, EvolverConfig(scope="group"), FeedbackEvolver())
    (n,) = asyncio.run(loop.observe(*turn("bob/p", "s3"))).accepted
    assert scope_of(team.get(n)) == "group:team"


def test_a_users_failure_never_rewrites_a_global_skill(tmp_path: Path):
    bank = SkillBank(tmp_path, SkillsConfig())
    bank.add(sk("config-rules", None, "modify config json"))

    class Rewriter:  # an LLM evolver that "refines" the global skill in place
        name = "llm"

        def teaches(self, failure):
            return True

        async def evolve(self, failures, existing):
            target = next(s for s in existing if s.name == "config-rules")
            return [target.model_copy(update={"body": "rewritten by one user's failure"})]

    loop = EvolutionLoop(bank, EvolverConfig(), Rewriter())
    (name,) = asyncio.run(loop.observe(*turn("alice/p", "s1"))).accepted
    assert name != "config-rules" and scope_of(bank.get(name)) == "user:alice"
    assert bank.get("config-rules").body == "modify config json"
    glob = EvolutionLoop(bank, EvolverConfig(scope="global"), Rewriter())
    assert asyncio.run(glob.observe(*turn("alice/p", "s2"))).accepted == ["config-rules"]  # MetaClaw's mode


SPEC = {"type": "multi_choice", "options": {k: k for k in "ABCD"}, "answer": ["B"]}


def promote_job(tmp_path: Path, follows_rules: bool) -> CollectiveJob:
    bank = SkillBank(tmp_path / "skills", SkillsConfig())
    bank.add(Skill(name="boxed", description="Answer in \\boxed{}.", body="Put the letter in \\boxed{}.",
                   metadata={"scope": "user:alice"}))
    store = EvidenceStore(tmp_path)
    msgs = [{"role": "system", "content": "Quiz."}, {"role": "user", "content": "Which? A-D"}]
    store.append([Evidence(turn_id=f"t{i}", session_id=f"s-{u}", tenant=f"{u}/p", reward=r, skills=s, eval_spec=SPEC,
                           messages=msgs) for i, (u, r, s) in enumerate([("alice", 1.0, ["boxed"]),
                                                                         ("bob", -1.0, [])])])

    async def generate(messages, max_tokens):
        boxed = follows_rules and "\\boxed" in messages[0]["content"]
        return "\\boxed{B}" if boxed else "B"

    async def grade(messages, reply, spec, files=None):
        return evaluate(spec, reply, None).score

    cfg = CollectiveConfig(gate=GateConfig(held_back=2))
    return CollectiveJob(bank, store, KVStore(tmp_path / "kv.db"), cfg, Validator(cfg.gate, generate, grade))


def test_promotion_goes_through_the_gate(tmp_path: Path):
    job = promote_job(tmp_path / "a", follows_rules=False)
    out = asyncio.run(job.promote("boxed", "group:team"))
    assert not out["decisions"][0]["published"] and scope_of(job.bank.get("boxed")) == "user:alice"
    job = promote_job(tmp_path / "b", follows_rules=True)
    out = asyncio.run(job.promote("boxed", "global"))
    (d,) = out["decisions"]
    assert d["published"] and d["action"] == "promote", d
    assert scope_of(job.bank.get("boxed")) == "global" and job.bank.version_of("boxed") == 2
    rec = job.store.decisions()[0]
    assert rec["verdict"]["held_back_results"] == 1  # bob's task: the new audience's, with the skill added
    with pytest.raises(ValueError, match="already has scope"):
        asyncio.run(job.promote("boxed", "global"))
