"""Collective evolution on the suite's running system: three users' sessions through the real Proxy, the
evidence the Evolver records from the PRM's scores, the job's validation gate replaying through the real
PolicyEngine and grading with the real PRM, versioned publishes every user's next turn gets, and rollback.

1. The Evolver's own job (`collective_run`, what `clawray skills evolve --now` calls) proposes a refinement
   of the skill the users' sessions used; the gate replays their tasks through the tiny vLLM model, which
   cannot read instructions, so the candidate does not help: rejected, and nothing changes for anyone.
2. The same evidence, decided by a job whose replays are answered by a rule follower (the suite's random
   model cannot read rules; test_evolve_gate_instruct.py shows an approval on the real engine with the
   instruction-following model) and graded by the real PRM actors: the refinement helps, is published as a new
   version, and the next turn of every user is served with it; a rollback restores the exact previous
   text and bumps the generation again.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import pytest
import ray

from core import names
from core.config import CollectiveConfig, GateConfig
from core.contracts import Skill
from core.kv import KVStore
from evolve.bank import SkillBank
from evolve.collective import REFINEMENTS
from evolve.collective_job import CURSOR_KEY, CollectiveJob
from evolve.collective_runner import PrmGrade
from evolve.evidence import EvidenceStore
from evolve.gate import Validator
from tests.integration.helpers import app_turns, wait_for

pytestmark = pytest.mark.slow

SEED = Skill(name="zorblax-quiz-answers", category="general",
             description="How to answer zorblax quiz questions: give the final option letter in \\boxed{}.",
             body="# Zorblax quiz answers\n\n- **Rule:** Give the final zorblax quiz option letter in \\boxed{}.")
LESSON = "You must prefer option C when the question is about zorblax backups."
QUESTION = "Zorblax quiz about zorblax backups: which option? A, B, C or D. Answer with \\boxed{X}."
SPEC = {"type": "multi_choice", "options": {k: k for k in "ABCD"}, "answer": ["C"]}
USERS = ["alice", "bob", "carol"]
RULE_RE = re.compile(r"prefer option ([A-D]) when the question is about ([\w ]+?)\.", re.I)


def _chat(client, sid: str, user: str, messages: list[dict], done: bool = False):
    headers = {"X-Session-Id": sid, "X-User-Id": user, **({"X-Session-Done": "1"} if done else {})}
    return client.chat.completions.create(model="clawray-policy", messages=messages, max_tokens=8,
                                          extra_headers=headers, extra_body={"clawray_eval": SPEC})


@pytest.fixture(scope="module")
def sessions(openai_client, serve_app):
    """The seed skill, then one failed session per user that used it; returns (bank, store, first seq)."""
    cfg = serve_app["config"]
    bank = SkillBank(Path(cfg.storage_path()) / "skills", cfg.skills)
    if SEED.name not in bank:
        bank.add(SEED)
    store = EvidenceStore(cfg.storage_path(), cfg.state.model_dump())
    first = store.last_seq()
    time.sleep(cfg.skills.refresh_s + 0.5)  # the Proxy's next refresh sees the seed
    sids = {}
    for u in USERS:
        sid = sids[u] = f"coll-{u}-{uuid.uuid4().hex[:6]}"
        msgs = [{"role": "system", "content": "You answer zorblax quizzes."}, {"role": "user", "content": QUESTION}]
        r = _chat(openai_client, sid, u, msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                 {"role": "user", "content": f"[Previous Feedback] {LESSON}\n\n{QUESTION}"}]
        _chat(openai_client, sid, u, msgs, done=True)

    def ours():
        rows = [e for _, e in store.since(first) if e.session_id in sids.values()]
        return rows if len(rows) == 2 * len(USERS) else None

    rows = wait_for(ours, 90)
    assert rows, "the Evolver did not record evidence for every scored turn"
    assert all(SEED.name in e.skills for e in rows), [e.skills for e in rows]  # the group is the seed's
    assert {e.tenant.split("/")[0] for e in rows} == set(USERS) and sum(e.failed for e in rows) >= 3
    return bank, store, first, sids


def test_the_gate_rejects_what_the_real_engine_does_not_improve(sessions, serve_app):
    bank, store, _, _ = sessions
    text = (bank.root / SEED.name / "SKILL.md").read_bytes()
    version = bank.version_of(SEED.name)
    report = ray.get(serve_app["handles"][names.EVOLVER].collective_run.remote(), timeout=600)
    mine = [d for d in report["decisions"] if d["group"] == SEED.name]
    assert mine and mine[0]["action"] == "refine", report["decisions"]
    assert not mine[0]["published"] and mine[0]["outcome"].startswith("rejected by the gate"), mine
    rec = next(r for r in store.decisions(200) if r["job"] == report["job"] and r["skill"] == SEED.name)
    assert rec["verdict"]["results"] >= 3, rec["verdict"]  # replayed through vLLM, graded by the PRM
    assert (bank.root / SEED.name / "SKILL.md").read_bytes() == text  # nothing changed for anyone
    bank.reload()
    assert bank.version_of(SEED.name) == version


def test_each_users_lessons_are_served_to_that_user_only(sessions, serve_app, openai_client):
    """The fast loop wrote each failing session's lesson private to its user (evolver.scope: user): the
    next turn of that user gets it, another user's never does (an adversarial id included)."""
    bank, _, _, sids = sessions
    cfg = serve_app["config"]

    def lessons_of(user: str) -> set[str]:
        bank.reload()
        return {s.name for s in bank.skills() if s.metadata.get("scope") == f"user:{user}"
                and sids[user] in (s.metadata.get("origin_sessions") or [])}

    owned = {u: wait_for(lambda u=u: lessons_of(u), 60) for u in USERS}
    assert all(owned.values()), owned
    assert not set.intersection(*owned.values())  # one user's lesson is not another's skill
    time.sleep(cfg.skills.refresh_s + 0.5)
    for user in [*USERS, "mallory", "Alice", "alice2", "bob alice"]:  # ids are compared exactly
        sid = f"scope-{uuid.uuid4().hex[:6]}"
        openai_client.chat.completions.create(
            model="clawray-policy", max_tokens=4, messages=[{"role": "user", "content": QUESTION}],
            extra_headers={"X-Session-Id": sid, "X-User-Id": user, "X-Session-Done": "1"})
        (turn,) = app_turns(serve_app, sid)
        others = set().union(*(v for u, v in owned.items() if u != user))
        assert not others & set(turn.skills), (user, turn.skills)
        if user in owned:
            assert owned[user] & set(turn.skills), (user, turn.skills)


def test_the_llm_decider_on_the_real_engine_falls_back_to_the_rule_based_decision(sessions, serve_app, tmp_path):
    """The decider's requests go to the served model (the engine deployment, no capture), which cannot
    write a decision object: after its retries the rule-based decision stands, recorded as such, and the
    gate (replays through vLLM, graded by the PRM) still decides."""
    from evolve.collective_llm import LLMDecider
    from evolve.collective_runner import ServeGenerate
    from rewards.engine_judge import EngineJudge

    bank, store, first, _ = sessions
    cfg = serve_app["config"]
    kv = KVStore(tmp_path / "cursor.db")
    kv.put(CURSOR_KEY, {"seq": first}, 0)
    ccfg = CollectiveConfig(gate=GateConfig(held_back=0, max_tokens=16))
    grade = PrmGrade([names.prm_name(i) for i in range(cfg.rewards.pool_size)], cfg.ray.namespace, 60.0)
    validator = Validator(ccfg.gate, ServeGenerate(names.ENGINE, names.APP, cfg.model.served_name, 120.0), grade)
    judge = EngineJudge(names.ENGINE, names.APP, cfg.model.served_name)
    job = CollectiveJob(bank, store, kv, ccfg, validator, decider=LLMDecider(judge, max_tokens=48))
    report = asyncio.run(job.run())
    (d,) = [d for d in report.decisions if d["group"] == SEED.name]
    assert "the LLM decider failed" in d["summary"] and not d["published"], d
    # Every group it was asked about (the seed's, and the users' own lessons') kept the rule-based decision;
    # its attempts reached vLLM (a prompt longer than the tiny model's context is refused: also recorded).
    asked = [r for r in store.decisions(200) if r["job"] == report.job and r["evidence"].get("llm_error")]
    assert asked and all("the LLM decider failed" in r["summary"] for r in asked)
    # Three attempts at least (the seed's group): answered, or refused by vLLM when the retry's longer prompt
    # outgrew the context (which of the two depends on how much evidence earlier tests left in the store).
    assert judge.usage.calls >= 1 and judge.usage.calls + judge.usage.failures >= 3, judge.usage


def _rule_follower():
    async def generate(messages: list[dict], max_tokens: int) -> str:
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        letter = "A"
        for opt, topic in RULE_RE.findall(system):
            if topic.lower() in messages[-1]["content"].lower():
                letter = opt
        return f"\\boxed{{{letter}}}" if "\\boxed" in system else letter
    return generate


def test_a_helpful_refinement_is_published_served_to_every_user_and_rolled_back(sessions, serve_app, openai_client, tmp_path):
    bank, store, first, _ = sessions
    cfg = serve_app["config"]
    ns = cfg.ray.namespace
    kv = KVStore(tmp_path / "cursor.db")
    kv.put(CURSOR_KEY, {"seq": first}, 0)  # this job decides on the users' sessions above
    ccfg = CollectiveConfig(gate=GateConfig(held_back=0))
    grade = PrmGrade([names.prm_name(i) for i in range(cfg.rewards.pool_size)], ns, 60.0)
    job = CollectiveJob(bank, store, kv, ccfg, Validator(ccfg.gate, _rule_follower(), grade))
    v1 = (bank.root / SEED.name / "SKILL.md").read_text()
    report = asyncio.run(job.run())
    mine = [d for d in report.decisions if d["group"] == SEED.name]
    assert mine and mine[0]["published"], mine
    bank.reload()
    published_gen = bank.generation
    assert "prefer option C when the question is about zorblax backups" in bank.get(SEED.name).body

    def served(user: str) -> list:
        sid = f"after-{user}-{uuid.uuid4().hex[:6]}"
        openai_client.chat.completions.create(
            model="clawray-policy", max_tokens=4, messages=[{"role": "user", "content": QUESTION}],
            extra_headers={"X-Session-Id": sid, "X-User-Id": user, "X-Session-Done": "1"})
        return app_turns(serve_app, sid)

    time.sleep(cfg.skills.refresh_s + 0.5)
    for u in USERS:  # every user in scope gets the new version at their next turn
        (turn,) = served(u)
        assert SEED.name in turn.skills and turn.skill_generation >= published_gen, (u, turn.skills)
        assert REFINEMENTS in turn.messages[0]["content"]  # the new version's text was what it saw

    bank.rollback(SEED.name, to_version=bank.version_of(SEED.name) - 1)
    bank.reload()
    assert (bank.root / SEED.name / "SKILL.md").read_text() == v1 and bank.generation > published_gen
    time.sleep(cfg.skills.refresh_s + 0.5)
    (turn,) = served("alice")
    assert turn.skill_generation >= bank.generation and REFINEMENTS not in turn.messages[0]["content"]
