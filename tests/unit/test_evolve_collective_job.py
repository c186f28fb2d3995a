"""CollectiveJob on a real SkillBank, evidence store (SQLite) and the real checkers: the gate rejects what does
not help and changes nothing; publishes what helps with its audit record; two concurrent jobs lose no update.

The replays' model is a deterministic rule follower (what the tiny CPU model cannot be yet: it cannot read
instructions, issue 18): it answers \\boxed{X} when the system prompt says to box answers, and prefers the
option a rule names for the question's topic. Grading is the real multi_choice checker.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from core.config import CollectiveConfig, GateConfig, SkillsConfig
from core.contracts import Skill
from core.kv import KVStore
from evolve.bank import SkillBank
from evolve.collective_job import CollectiveJob
from evolve.evidence import Evidence, EvidenceStore
from evolve.gate import Validator
from rewards.checkers import evaluate

RULE_RE = re.compile(r"prefer option ([A-D]) when the question is about (\w+)", re.I)
BASE = Skill(name="boxed-answers", description="Put the final option letter of a multiple-choice answer in \\boxed{}.",
             category="general", body="# Boxed answers\n\n- **Rule:** Put the final option letter in \\boxed{}.")


def follow_rules(messages: list[dict]) -> str:
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    question = messages[-1]["content"]
    letter = "B"
    for opt, topic in RULE_RE.findall(system):
        if topic.lower().rstrip("s") in question.lower():
            letter = opt
    return f"\\boxed{{{letter}}}" if "\\boxed" in system else letter


async def grade(messages, reply, spec, files=None):
    return evaluate(spec, reply, None).score


def spec(answer: str) -> dict:
    return {"type": "multi_choice", "options": {k: k for k in "ABCD"}, "answer": [answer]}


def failed_turns(store: EvidenceStore, users: list[str], topic: str, answer: str, lesson: str, skills=("boxed-answers",)):
    rows = []
    for u in users:
        question = f"Which option fits the {topic} question? Options A-D."
        rows.append(Evidence(turn_id=f"{u}-{topic}", session_id=f"s-{u}-{topic}", tenant=f"{u}/w", reward=-1.0,
                             skills=list(skills), instruction=question, feedback=f"[Feedback] {lesson}",
                             eval_spec=spec(answer), messages=[{"role": "system", "content": "You answer quizzes."},
                                                               {"role": "user", "content": question}]))
    store.append(rows)


class Replay:
    def __init__(self):
        self.claims, self.generations = [], []

    async def begin_evolution(self, ids, ttl):
        self.claims.append(list(ids))
        return str(len(self.claims)), list(ids)

    async def end_evolution(self, token, generation, release):
        self.generations.append(generation)


def job(tmp: Path, skills: Path, generate, name: str = "collective", replay=None, cfg=None) -> CollectiveJob:
    cfg = cfg or CollectiveConfig(min_sessions=2, gate=GateConfig(held_back=0))
    store = EvidenceStore(tmp / f"ev-{name}")
    return CollectiveJob(SkillBank(skills, SkillsConfig()), store, KVStore(tmp / f"kv-{name}.db"), cfg,
                         Validator(cfg.gate, generate, grade), replay, name=name)


async def rules(messages, max_tokens):
    return follow_rules(messages)


def test_a_candidate_that_does_not_help_is_rejected_and_nothing_changes(tmp_path):
    skills = tmp_path / "skills"
    SkillBank(skills, SkillsConfig()).add(BASE)

    async def ignores_skills(messages, max_tokens):  # a model that reads no instruction
        return "B"

    j = job(tmp_path, skills, ignores_skills)
    before = (skills / "boxed-answers" / "SKILL.md").read_bytes()
    gen0 = j.bank.generation
    failed_turns(j.store, ["alice", "bob"], "backups", "C", "You must prefer option C when the question is about backups.")
    report = asyncio.run(j.run())
    (d,) = report.decisions
    assert d["action"] == "refine" and not d["published"] and "rejected by the gate" in d["outcome"]
    assert (skills / "boxed-answers" / "SKILL.md").read_bytes() == before and j.bank.generation == gen0
    (rec,) = j.store.decisions()
    assert rec["verdict"]["results"] == 2 and rec["verdict"]["candidate_mean"] == 0.0 and rec["candidate"]
    assert report.cursor == j.store.last_seq()  # decided: these rows are not decided again
    assert asyncio.run(j.run()).skipped_reason == "no new sessions since the last run"


def test_a_candidate_that_helps_is_published_with_its_audit_record(tmp_path):
    skills = tmp_path / "skills"
    replay = Replay()
    j = job(tmp_path, skills, rules, replay=replay)
    lesson = "You must put the final option letter in \\boxed{} for every quiz answer."
    failed_turns(j.store, ["alice", "bob"], "quiz", "B", lesson, skills=())
    report = asyncio.run(j.run())
    (d,) = report.decisions
    assert d["action"] == "create" and d["published"], d
    name = d["skill"]
    assert j.bank.version_of(name) == 1 and j.bank.generation == 1 and replay.generations == [1]
    assert sorted(replay.claims[0]) == ["alice-quiz", "bob-quiz"]  # support: they taught the skill
    rec = [r for r in j.bank.history() if r["name"] == name][-1]
    assert rec["evolver"] == "collective" and rec["summary"].startswith("create")
    assert rec["validation"]["approved"] and rec["validation"]["candidate_mean"] == 1.0
    assert rec["evidence"]["tenants"] == ["alice/w", "bob/w"]


def test_two_concurrent_jobs_lose_no_update(tmp_path):
    """Both jobs decide on version 1 of the skill before either publishes (an interleaving forced with events):
    the first publishes version 2; the second's compare-and-swap fails, it decides again on version 2 and
    publishes version 3 with BOTH rules."""
    skills = tmp_path / "skills"
    SkillBank(skills, SkillsConfig()).add(BASE)
    started = {"A": asyncio.Event(), "B": asyncio.Event()}
    a_done = asyncio.Event()

    def gen(who: str):
        async def generate(messages, max_tokens):
            started[who].set()
            await started["A"].wait()
            await started["B"].wait()
            if who == "B":
                await a_done.wait()
            return follow_rules(messages)
        return generate

    ja, jb = job(tmp_path, skills, gen("A"), "A"), job(tmp_path, skills, gen("B"), "B")
    failed_turns(ja.store, ["alice", "bob"], "backups", "C", "You must prefer option C when the question is about backups.")
    failed_turns(jb.store, ["carol", "dave"], "dates", "D", "You must prefer option D when the question is about dates.")

    async def both():
        tb = asyncio.create_task(jb.run())
        ra = await ja.run()
        a_done.set()
        return ra, await tb

    ra, rb = asyncio.run(both())
    assert ra.published == ["boxed-answers"] and rb.published == ["boxed-answers"]
    final = SkillBank(skills, SkillsConfig())
    body = final.get("boxed-answers").body
    assert "option C when the question is about backups" in body and "option D when the question is about dates" in body
    assert final.version_of("boxed-answers") == 3
    bases = [r.get("base_version") for r in final.history() if r["name"] == "boxed-answers" and r["action"] == "update"]
    assert bases == [1, 2]  # B's write was made on A's version, never over it


def test_every_run_waits_for_the_fast_loops_evolution(tmp_path):
    """The scheduled run calls `run()` with no arguments: it must still be exclusive with a fast-loop
    evolution writing the same bank (the lock the runner was built with), not only `evolve --now`."""
    from evolve.collective_runner import CollectiveRunner
    from evolve.loop import NoReplay

    async def scenario():
        loop_lock = asyncio.Lock()
        cfg = CollectiveConfig(gate=GateConfig(enabled=False))
        runner = CollectiveRunner(SkillBank(tmp_path / "skills", SkillsConfig()), cfg, str(tmp_path), None,
                                  NoReplay(), None, lock=loop_lock)
        async with loop_lock:  # a fast-loop evolution is writing the bank
            task = asyncio.create_task(runner.run())
            await asyncio.sleep(0)
            for _ in range(5):
                await asyncio.sleep(0)
            assert not task.done()
        return await task

    assert asyncio.run(scenario())["skipped_reason"] == "no new sessions since the last run"


def test_a_run_that_may_only_validate_while_idle_stops_before_its_next_replay_once_users_are_back(tmp_path):
    """`still_idle` is asked before every engine call: it says yes once, then the users are back. The run
    stops after that one replay (GateYielded), publishes nothing and keeps its cursor, so the next run
    (idle again) decides the same sessions and publishes."""
    from evolve.gate import GateYielded

    skills = tmp_path / "skills"
    calls: list[str] = []

    async def counting(messages, max_tokens):
        calls.append(messages[-1]["content"])
        return follow_rules(messages)

    j = job(tmp_path, skills, counting)
    failed_turns(j.store, ["alice", "bob"], "quiz", "B", "You must put the final option letter in \\boxed{} "
                 "for every quiz answer.", skills=())
    asks = []

    async def idle_once():
        asks.append(len(calls))
        return len(asks) == 1

    try:
        asyncio.run(j.run(still_idle=idle_once))
        raise AssertionError("the run did not yield")
    except GateYielded as e:
        assert "no longer idle" in str(e)
    assert len(calls) == 1 and asks[0] == 0  # asked before the first call; no engine call after the "no"
    assert len(j.bank) == 0 and j.bank.generation == 0 and j.store.decisions() == []
    report = asyncio.run(j.run())  # idle again: the same sessions, decided and published now
    assert report.published and report.cursor == j.store.last_seq() and len(calls) == 1 + 4


def test_only_scheduled_runs_yield_to_users_and_the_runner_counts_them(tmp_path):
    """The schedule's runs ask OMLS before every replay (only_when_idle); `clawray skills evolve --now` is an
    operator's explicit request and does not."""
    from evolve.collective_runner import CollectiveRunner
    from evolve.gate import GateYielded
    from evolve.loop import NoReplay

    skills = tmp_path / "skills"
    cfg = CollectiveConfig(min_sessions=2, gate=GateConfig(held_back=0))
    runner = CollectiveRunner(SkillBank(skills, SkillsConfig()), cfg.model_copy(update={"gate": GateConfig(enabled=False)}),
                              str(tmp_path), None, NoReplay(), None)
    runner.job = job(tmp_path, skills, rules, cfg=cfg)
    failed_turns(runner.job.store, ["alice", "bob"], "quiz", "B", "You must put the final option letter in "
                 "\\boxed{} for every quiz answer.", skills=())
    asked = []

    async def busy():
        asked.append(1)
        return False

    runner._idle = busy
    try:
        asyncio.run(runner.run(scheduled=True))
        raise AssertionError("the scheduled run did not yield")
    except GateYielded:
        pass
    assert runner.counts["yielded"] == 1 and runner.counts["runs"] == 0 and asked
    n = len(asked)
    out = asyncio.run(runner.run())  # --now: not asked
    assert out["published"] and len(asked) == n and runner.counts["runs"] == 1


def test_a_change_another_host_published_first_is_decided_again_on_it_not_overwritten(tmp_path):
    """The library lives in a bucket (evolve/mirror.py). Host B's job decides a refinement on version 1;
    meanwhile host A (`clawray skills` there) publishes its own edit of the same skill. B's local
    compare-and-swap succeeds (its folder never saw A's edit), but its publish to the bucket loses the race:
    the job gets the skill back as lost, decides again on A's version and publishes a version with both
    changes. Nothing A wrote is overwritten."""
    from evolve.mirror import SkillMirror

    bucket = str(tmp_path / "bucket")
    seed = SkillMirror(bucket, tmp_path / "seed")
    SkillBank(tmp_path / "seed", SkillsConfig()).add(BASE)
    seed.publish()
    host_a, host_b = SkillMirror(bucket, tmp_path / "a"), SkillMirror(bucket, tmp_path / "b")
    host_a.pull()
    host_b.pull()
    a_rule = "You must prefer option D when the question is about dates."
    decided = asyncio.Event()

    async def generate(messages, max_tokens):  # B's gate replays: host A edits while they run
        if not decided.is_set():
            decided.set()
            bank_a = SkillBank(tmp_path / "a", SkillsConfig())
            old = bank_a.get("boxed-answers")
            bank_a.add(old.model_copy(update={"body": old.body + f"\n- **Rule:** {a_rule}"}), allow_updates=True)
            assert host_a.publish().lost == []
        return follow_rules(messages)

    async def sync():
        out = host_b.publish()
        return out.lost if out is not None else host_b.lost_since_publish

    cfg = CollectiveConfig(min_sessions=2, gate=GateConfig(held_back=0))
    store = EvidenceStore(tmp_path / "ev")
    jb = CollectiveJob(SkillBank(tmp_path / "b", SkillsConfig()), store, KVStore(tmp_path / "kv.db"), cfg,
                       Validator(cfg.gate, generate, grade), sync=sync)
    failed_turns(store, ["carol", "dave"], "backups", "C", "You must prefer option C when the question is about backups.")
    report = asyncio.run(jb.run())
    assert report.published == ["boxed-answers"], report.decisions
    reader = SkillMirror(bucket, tmp_path / "reader")
    reader.pull()
    body = SkillBank(tmp_path / "reader", SkillsConfig()).get("boxed-answers").body
    assert a_rule in body and "option C when the question is about backups" in body
    hist = SkillBank(tmp_path / "reader", SkillsConfig()).history()
    assert [r["action"] for r in hist].count("lost") == 1
