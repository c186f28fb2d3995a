"""The validation gate deciding on the real engine with a model that reads rules: the instruction-following
tiny model (scripts/make_instruct_model.py) served by a second `PolicyEngine` deployment on the suite's Ray,
graded by the suite's real PRM actors (the workload's `uppercase` checker).

Three users' sessions of clawray-mini's ticket-title rounds failed, each corrected by the same feedback
("Ticket titles must be written in uppercase only."), and no skill served to everyone states it. The
collective job decides `create`; the gate replays every task greedily with nothing and with the candidate
injected: with the rule stated the model writes the titles in capitals, so the candidate is approved and
published as version 1 with its verdict. On the same engine and tasks, a refinement stating the opposite
rule under the published name is not approved, and the opposite rule as the evolver states it makes them
worse and is rejected. The suite's other collective tests (test_evolve_collective.py) show
the random tiny model's rejections and the publish reaching every user's next turn.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core import names
from core.config import CollectiveConfig, GateConfig
from core.kv import KVStore
from evolve.bank import SkillBank
from evolve.collective_job import CollectiveJob
from evolve.collective_runner import PrmGrade, ServeGenerate
from evolve.evidence import Evidence, EvidenceStore
from evolve.evolvers import Failure, FeedbackEvolver
from evolve.gate import Validator
from harness.workload import load_workload

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "clawray-gate-instruct"
USERS = ["alice", "bob", "carol"]


@pytest.fixture(scope="module")
def instruct_engine(serve_app, tmp_path_factory):
    """`generate` through a PolicyEngine serving tiny-instruct (its own storage root: no adapters shared)."""
    from ray import serve

    from cluster.serve_app import build_engine

    cfg = serve_app["config"]
    icfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": "tiny-instruct"}),
                                  "engine": cfg.engine.model_copy(update={"num_cpus": 0.5}),
                                  "storage_root": str(tmp_path_factory.mktemp("instruct-storage"))})
    serve.run(build_engine(icfg), name=APP, route_prefix=None)
    yield ServeGenerate(names.ENGINE, APP, icfg.model.served_name, 300.0)
    serve.delete(APP)


def _ticket_rows() -> list[Evidence]:
    """Each user's failed ticket-title turns of one day of clawray-mini (the rows the Evolver records)."""
    wl = load_workload(REPO / "workloads" / "clawray-mini")
    system = {"role": "system", "content": wl.persona()}
    rows = []
    for user, day in zip(USERS, wl.days, strict=True):
        for i, r in enumerate(x for x in day.rounds if x.type == "uppercase"):
            rows.append(Evidence(turn_id=f"{user}-{r.id}", session_id=f"{user}-{day.id}", tenant=f"{user}/default",
                                 turn_index=i, reward=-1.0, instruction=r.question, response=r.question.lower(),
                                 feedback=r.feedback_text(False), eval_spec=r.eval_spec(),
                                 messages=[system, {"role": "user", "content": r.question}]))
    return rows


def test_the_gate_on_the_instruction_following_engine_publishes_what_helps_and_rejects_what_hurts(
        serve_app, instruct_engine, tmp_path):
    cfg = serve_app["config"]
    rows = _ticket_rows()
    assert len(rows) >= 6 and len({e.session_id for e in rows}) == 3
    bank = SkillBank(tmp_path / "skills", cfg.skills)
    store = EvidenceStore(tmp_path)
    store.append(rows)
    gate = GateConfig(held_back=0, max_tasks=len(rows), max_tokens=24)
    grade = PrmGrade([names.prm_name(i) for i in range(cfg.rewards.pool_size)], cfg.ray.namespace, 120.0)
    validator = Validator(gate, instruct_engine, grade)
    job = CollectiveJob(bank, store, KVStore(tmp_path / "cursor.db"), CollectiveConfig(gate=gate), validator)

    report = asyncio.run(job.run())
    (d,) = report.decisions  # one group: the sessions that used no skill
    assert d["action"] == "create" and d["published"], report.as_dict()
    rec = next(r for r in store.decisions(50) if r["job"] == report.job and r["action"] == "create")
    v = rec["verdict"]
    # Every task replayed and graded twice; the rule stated made the model write capitals.
    assert v["results"] == len(rows) and v["ungraded"] == 0, v
    assert v["candidate_mean"] >= gate.min_mean and v["candidate_mean"] > v["current_mean"], v
    bank.reload()
    (name,) = report.published
    created = bank.get(name)
    assert bank.version_of(name) == 1 and "uppercase" in created.body.lower()
    assert bank.history()[-1]["name"] == name

    # The opposite rule, as a refinement of what was just published (its name still says "uppercase"): not
    # approved. Whether the model then follows the name or the rule depends on the build (docs/bench.md: the
    # Xeon's follows the name and scores as before), so only the refusal is asserted here.
    wrong = created.model_copy(update={
        "description": "Ticket titles must be written in lowercase only, no capital letters.",
        "body": "# Ticket titles\n\n- **Rule:** Ticket titles must be written in lowercase only, no capital letters."})
    bad = asyncio.run(Validator(gate, instruct_engine, grade).validate(wrong, created, rows))  # (a new loop)
    assert not bad.approved and bad.candidate_mean <= bad.current_mean, bad.as_dict()
    # The opposite rule as the evolver states it (name and rule agree) in place of the published skill: the
    # model writes the titles in lowercase, worse on every task, refused.
    (opposite,) = FeedbackEvolver().distil([Failure(rows[0].instruction, "X", wrong.description, -1.0, "d", "e")], [])
    worse = asyncio.run(Validator(gate, instruct_engine, grade).validate(opposite, created, rows))
    print(f"gate on tiny-instruct: create {v['reason']}; refinement to the opposite rule: {bad.reason}; "
          f"the opposite rule ({opposite.name}): {worse.reason}")
    assert not worse.approved and worse.candidate_mean < worse.current_mean, worse.as_dict()
    assert bank.get(name).body == created.body and bank.version_of(name) == 1
