"""Collective evolution's pure parts: evidence, summaries, grouping, decisions, the gate's arithmetic."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.config import GateConfig
from core.contracts import Sample, Skill, Turn
from evolve.collective import NO_SKILL, REFINEMENTS, decide, group_by_skill, summarise, summarise_all
from evolve.evidence import Evidence, EvidenceStore, evidence_from, strip_injection, touched_skills
from evolve.gate import TaskResult, Validator, verdict, with_skill
from evolve.retrieval import render_skills_block

BACKUP = "You must create a .bak copy before modifying a config file."
DATES = "Dates must be written as YYYY-MM-DD in every report."


def ev(sid: str, i: int, reward: float, feedback: str = "", skills=(), tenant: str = "alice/w",
       instruction: str = "Please modify config.json to set debug=true", spec: dict | None = None) -> Evidence:
    return Evidence(turn_id=f"{sid}-{i}", session_id=sid, tenant=tenant, turn_index=i, reward=reward,
                    skills=list(skills), instruction=instruction, feedback=feedback, eval_spec=spec,
                    messages=[{"role": "system", "content": "You are helpful."},
                              {"role": "user", "content": instruction}] if spec else [])


def backup_skill(version: int = 1) -> Skill:
    return Skill(name="bak-copy-config", description="Create a .bak copy before modifying a config file.",
                 category="file_operations", body="# Backups\n\n- **Rule:** Create a .bak copy before modifying a config file.",
                 metadata={"lesson": "create a .bak copy before modifying a config file", "version": version})


# ------------------------------------------------------------------ evidence
def test_strip_injection_removes_only_the_skills_block():
    block = render_skills_block([backup_skill()])
    msgs = [{"role": "system", "content": f"Be brief.\n\n{block}\n\n## Memory\nUser likes tea."},
            {"role": "user", "content": "hi"}]
    out = strip_injection(msgs)
    assert out[0]["content"] == "Be brief.\n\n## Memory\nUser likes tea."
    assert out[1] == msgs[1] and msgs[0]["content"].startswith("Be brief.")  # input untouched
    only = strip_injection([{"role": "system", "content": block}, {"role": "user", "content": "x"}])
    assert only == [{"role": "user", "content": "x"}]
    parts = strip_injection([{"role": "system", "content": [{"type": "text", "text": "A"},
                                                            {"type": "text", "text": block}]}])
    assert parts[0]["content"] == [{"type": "text", "text": "A"}]


def test_touched_skills_from_tool_call_arguments():
    calls = [{"function": {"name": "read_file", "arguments": '{"path": "~/.claw/skills/bak-copy-config/SKILL.md"}'}},
             {"function": {"name": "edit", "arguments": {"file": "skills\\other\\SKILL.md"}}},
             {"name": "Read", "input": {"file_path": "/x/unknown-skill/SKILL.md"}}]
    assert touched_skills(calls, ["bak-copy-config", "other"]) == ["bak-copy-config", "other"]
    assert touched_skills([], ["x"]) == []


def test_evidence_from_a_turn_keeps_what_the_job_needs():
    block = render_skills_block([backup_skill()])
    turn = Turn(session_id="s", turn_index=2, tenant="bob/w", prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                messages=[{"role": "system", "content": f"Sys\n\n{block}"}, {"role": "user", "content": "do it"}],
                response_text="done", skills=["bak-copy-config"], next_state=[{"role": "user", "content": BACKUP}],
                tool_calls=[{"function": {"name": "cat", "arguments": '{"p": "bak-copy-config/SKILL.md"}'}}],
                eval_spec={"type": "multi_choice", "options": {"A": "x"}, "answer": ["A"]}, skill_generation=3)
    e = evidence_from(turn, Sample.from_turn(turn, -1.0, True), ["bak-copy-config"])
    assert (e.tenant, e.reward, e.instruction, e.feedback) == ("bob/w", -1.0, "do it", BACKUP)
    assert e.skills == ["bak-copy-config"] and e.touched == ["bak-copy-config"] and e.used == ["bak-copy-config"]
    assert e.messages[0]["content"] == "Sys" and e.skill_generation == 3 and "[tool calls] cat" in e.response


def test_evidence_store_is_idempotent_and_samples_other_sessions(tmp_path):
    store = EvidenceStore(tmp_path)
    spec = {"type": "multi_choice", "options": {"A": "a"}, "answer": ["A"]}
    rows = [ev("s1", 0, 1.0, spec=spec), ev("s2", 0, -1.0, spec=spec), ev("s3", 0, 1.0)]
    assert store.append(rows) == 3
    assert store.append(rows[:2]) == 0  # a re-delivered turn is stored once
    got = store.since(0)
    assert [e.turn_id for _, e in got] == ["s1-0", "s2-0", "s3-0"] and store.last_seq() == got[-1][0]
    assert store.since(got[0][0])[0][1].turn_id == "s2-0"
    assert [e.session_id for e in store.sample_outside(["s2"], 5)] == ["s1"]  # replayable, other sessions only
    store.record_decision("j", "x", "refine", False, {"outcome": "rejected"})
    assert store.decisions()[0]["outcome"] == "rejected" and store.decisions()[0]["published"] is False
    store.close()


# ------------------------------------------------------------------ summaries and groups
def test_summary_and_grouping_by_skill_used():
    a = summarise("a", [ev("a", 1, -1.0, BACKUP, ["bak-copy-config"]), ev("a", 0, 1.0, skills=["bak-copy-config"])])
    assert (a.turns, a.failures, a.used) == (2, 1, ["bak-copy-config"])
    assert a.lessons == ["must create a .bak copy before modifying a config file"]
    assert "2 turn(s), 1 failed" in a.summary and a.summary == summarise("a", list(reversed(a.rows))).summary
    b = summarise("b", [ev("b", 0, 1.0)])
    c = summarise("c", [ev("c", 0, 1.0, skills=["gone", "bak-copy-config"])])
    groups = group_by_skill([a, b, c], known=["bak-copy-config"])
    assert {k: [s.session_id for s in v] for k, v in groups.items()} == {NO_SKILL: ["b"], "bak-copy-config": ["a", "c"]}


# ------------------------------------------------------------------ decisions
def test_create_needs_a_recurring_uncovered_lesson():
    one = summarise_all([ev("u1", 0, -1.0, DATES)])
    assert decide(NO_SKILL, one, [], min_sessions=2).action == "skip"
    two = summarise_all([ev("u1", 0, -1.0, DATES, tenant="alice/w"), ev("u2", 0, -1.0, DATES, tenant="bob/w")])
    d = decide(NO_SKILL, two, [], min_sessions=2)
    assert d.action == "create" and d.candidate is not None and d.base_version == 0
    assert "YYYY-MM-DD" in d.candidate.body and "2 session(s)" in d.summary
    assert d.evidence["tenants"] == ["alice/w", "bob/w"] and d.evidence["lesson_sessions"] == ["u1", "u2"]
    covered = Skill(name="date-format", description="Dates must be written as YYYY-MM-DD in every report.", body="x")
    assert decide(NO_SKILL, two, [covered], min_sessions=2).action == "skip"


def test_refine_keeps_the_body_and_adds_only_the_new_lesson():
    skill = backup_skill(version=4)
    sessions = summarise_all([
        ev("a", 0, 1.0, skills=[skill.name]),  # a success: evidence that the skill works
        ev("b", 0, -1.0, "You must create a .bak copy before modifying a config file. "
                         "Always keep the original file permissions when writing the copy.", [skill.name]),
    ])
    d = decide(skill.name, sessions, [skill])
    assert d.action == "refine" and d.base_version == 4 and d.candidate is not None
    assert d.candidate.body.startswith(skill.body) and REFINEMENTS in d.candidate.body
    assert "original file permissions" in d.candidate.body and d.candidate.body.count("- ") == 2
    assert "kept the description and the whole body (1 of 2 session(s)" in d.summary


def test_skip_when_the_skill_already_says_it_and_optimise_when_retrieved_off_topic():
    skill = backup_skill()
    same = summarise_all([ev("a", 0, -1.0, BACKUP, [skill.name]), ev("b", 0, 1.0, skills=[skill.name])])
    assert decide(skill.name, same, [skill]).action == "skip"
    mixed = summarise_all([
        ev("a", 0, 1.0, skills=[skill.name], instruction="Modify the config file settings.yaml (keep a backup)"),
        ev("b", 0, -1.0, skills=[skill.name], instruction="Summarise the quarterly sales numbers in a poem"),
    ])
    d = decide(skill.name, mixed, [skill])
    assert d.action == "optimize_description" and d.candidate is not None
    assert d.candidate.body == skill.body and "Use for tasks about:" in d.candidate.description
    assert d.evidence["off_topic_sessions"] == ["b"] and d.evidence["helped_sessions"] == ["a"]
    assert decide("removed", mixed, [skill]).action == "skip"


# ------------------------------------------------------------------ the gate
def r(cur: float, cand: float, back: bool = False) -> TaskResult:
    return TaskResult("t", "s", back, cur, cand)


@pytest.mark.parametrize("results,approved,why", [
    ([], False, "min_results"),
    ([r(0, 1)], True, "approved"),
    ([r(1, 1)], False, "does not beat"),  # no worse, but not better
    ([r(0, 0.5)], False, "min_mean"),  # better, but below SkillClaw's 0.75
    ([r(1, 0)], False, "approval"),
    ([r(0, 1), r(1, 1)], True, "approved"),  # a tie at a pass counts as an approval
    ([r(0, 1), r(1, 0, back=True)], False, "held-back"),  # helps its group, hurts another
    ([r(0, 1), r(0, 0, back=True)], True, "held-back 0.000 -> 0.000"),
])
def test_gate_arithmetic(results, approved, why):
    v = verdict(results, GateConfig())
    assert v.approved is approved and why in v.reason


def test_gate_thresholds_come_from_config():
    assert verdict([r(0.5, 0.8)], GateConfig(margin=0.5)).approved is False
    assert verdict([r(0, 1)], GateConfig(min_results=2)).approved is False
    assert verdict([r(0, 1), r(1, 0.9, back=True)], GateConfig(held_back_tolerance=0.2)).approved is True
    assert verdict([r(0, 0.6)], GateConfig(min_mean=0.5)).approved is True


def test_validator_replays_current_and_candidate_and_grades_both():
    spec = {"type": "multi_choice", "options": {"A": "a", "B": "b"}, "answer": ["B"]}
    rule = Skill(name="boxed-answers", description="Give the final option in \\boxed{}.", body="Use \\boxed{B}.")
    seen: list[str] = []

    async def generate(messages, max_tokens):
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        seen.append(system)
        return "\\boxed{B}" if "boxed-answers" in system else "B"

    async def grade(messages, reply, eval_spec, files=None):
        return 1.0 if reply == "\\boxed{B}" else 0.0

    tasks = [ev("g", i, -1.0, spec=spec) for i in range(3)] + [ev("nospec", 0, -1.0)]
    held = [ev("other", 0, 1.0, spec=spec)]
    v = asyncio.run(Validator(GateConfig(), generate, grade).validate(rule, None, tasks, held))
    assert v.approved and (v.results, v.approvals, v.held_back_results) == (3, 3, 1)
    assert (v.current_mean, v.candidate_mean) == (0.0, 1.0)
    assert len(seen) == 8 and sum("boxed-answers" in s for s in seen) == 4  # A and B for each of 4 tasks
    assert with_skill([{"role": "user", "content": "q"}], rule)[0]["role"] == "system"

    async def ungradable(messages, reply, eval_spec, files=None):
        return None

    v = asyncio.run(Validator(GateConfig(), generate, ungradable).validate(rule, None, tasks, held))
    assert not v.approved and v.ungraded == 4 and "min_results" in v.reason


def test_a_lesson_only_private_skills_state_is_created_for_everyone():
    two = summarise_all([ev("u1", 0, -1.0, DATES, tenant="alice/w"), ev("u2", 0, -1.0, DATES, tenant="bob/w")])
    private = Skill(name="date-format", description="Dates must be written as YYYY-MM-DD in every report.", body="x",
                    metadata={"scope": "user:alice"})
    d = decide(NO_SKILL, two, [private], min_sessions=2)
    assert d.action == "create" and d.candidate.metadata["scope"] == "global" and d.candidate.name != "date-format"


def test_evidence_keeps_requests_of_replayable_turns_only_and_is_pruned_once_read(tmp_path):
    t = Turn(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
             messages=[{"role": "user", "content": "x" * 1000}])
    assert evidence_from(t, Sample.from_turn(t, 1.0, True), []).messages == []  # an agent's turn: no check
    store = EvidenceStore(tmp_path)
    old = ev("s1", 0, 1.0)
    old.created_at = 1.0
    store.append([old, ev("s2", 0, 1.0)])
    seq = store.last_seq()
    assert store.prune(before=100.0, upto_seq=0) == 0  # not read yet: kept
    assert store.prune(before=100.0, upto_seq=seq) == 1 and [e.session_id for _, e in store.since(0)] == ["s2"]


def test_decisions_are_an_audit_log_kept_unless_a_retention_is_set(tmp_path):
    """Pruning read evidence keeps every decision (rejections included) unless decisions_retention_days
    is configured."""
    store = EvidenceStore(tmp_path)
    store.record_decision("job-1", "backup-first", "refine", False, {"outcome": "rejected by the gate: ..."})
    assert store.prune(before=time.time() + 10, upto_seq=store.last_seq()) == 0
    assert [d["outcome"] for d in store.decisions()] == ["rejected by the gate: ..."]
    store.prune(before=0.0, upto_seq=0, decisions_before=time.time() + 10)
    assert store.decisions() == []
