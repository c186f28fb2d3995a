"""The collective loop on vs off for the users after a run (evolve/impact.py): each later task replayed with
the skills it was served and with the run's publishes undone, graded by the real checker. The replays'
model is the deterministic rule follower of test_evolve_collective_job.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from core.config import CollectiveConfig, GateConfig, SkillsConfig
from evolve.bank import SkillBank
from evolve.evidence import Evidence
from evolve.gate import Validator
from evolve.impact import measure, served_and_undone
from tests.unit.test_evolve_collective_job import BASE, failed_turns, grade, job, rules, spec


def later_task(user: str, topic: str, answer: str, generation: int, skills=("boxed-answers",)) -> Evidence:
    q = f"Which option fits the {topic} question? Options A-D."
    return Evidence(turn_id=f"{user}-{topic}-day2", session_id=f"s-{user}-day2", tenant=f"{user}/w", reward=0.0,
                    skills=list(skills), instruction=q, eval_spec=spec(answer), skill_generation=generation,
                    messages=[{"role": "system", "content": "You answer quizzes."}, {"role": "user", "content": q}])


def test_the_next_days_tasks_with_the_runs_refinement_and_without_it(tmp_path: Path):
    skills = tmp_path / "skills"
    SkillBank(skills, SkillsConfig()).add(BASE)
    j = job(tmp_path, skills, rules)
    failed_turns(j.store, ["alice", "bob"], "backups", "C", "You must prefer option C when the question is about backups.")
    report = asyncio.run(j.run())
    assert report.published == ["boxed-answers"] and report.published_from == {"boxed-answers": 1}
    gen = j.bank.generation
    rows = [later_task("carol", "backups", "C", gen), later_task("carol", "weather", "B", gen),
            later_task("dan", "backups", "C", gen, skills=())]
    undone = {"boxed-answers": j.bank.text_at("boxed-answers", 1)}
    got = asyncio.run(measure(j.validator, rows, j.bank.state_at, undone))
    by_task = {t.turn_id: (t.changed, t.on, t.off) for t in got.tasks}
    assert by_task == {"carol-backups-day2": (True, 1.0, 0.5),  # the refinement picks C (B: half credit)
                       "carol-weather-day2": (True, 1.0, 1.0),  # both versions box the default answer
                       "dan-backups-day2": (False, 0.0, 0.0)}  # no skill was injected: nothing changed
    assert got.by("tenant")["carol/w"] == {"on": 1.0, "off": 0.75, "tasks": 2, "changed": 2}


def test_a_created_skill_is_left_out_when_undone_and_an_unknown_one_both_ways():
    text = "---\nname: quiz-boxes\ndescription: Box answers.\n---\nBox the letter."
    e = later_task("x", "quiz", "A", 3, skills=("quiz-boxes", "hand-made"))
    on, off = served_and_undone(e, {"quiz-boxes": text}, {"quiz-boxes": None})
    assert [s.name for s in on] == ["quiz-boxes"] and off == []


def test_a_task_nothing_can_grade_is_counted_not_scored(tmp_path: Path):
    cfg = CollectiveConfig(gate=GateConfig(held_back=0))

    async def no_grade(messages, reply, spec, files=None):
        return None

    v = Validator(cfg.gate, rules, no_grade)
    bank = SkillBank(tmp_path / "s", SkillsConfig())
    got = asyncio.run(measure(v, [later_task("a", "quiz", "A", 0, skills=())], bank.state_at, {}))
    assert got.tasks == [] and got.ungraded == 1
    assert grade  # the shared grader is the real checker (imported for the module's fixtures)
