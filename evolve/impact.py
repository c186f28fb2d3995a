"""What a collective run changed for the users who came after it: their tasks with the loop on and off.

For each recorded task of the given sessions (a turn the gate can replay: its request and a check), two
replays through the serving engine, graded like the gate's (evolve/gate.py `Validator.replay`): **on**
with the skills the turn was actually injected with, as the library held them when it was served
(`state_at` its generation), and **off** with the collective run's publishes undone (a refined skill at
its version before the run, a created one left out). A task that none of the run's changes reached is
replayed once and counts the same both ways. Per session and per tenant: the mean grade on and off.

This is an A/B counterfactual on the same engine, adapter and grader, not two separate deployments: it
measures the collective run's edits themselves, which is what an operator asks ("did last night's shared
skills help the people who got them?"). The comparison leaves out what a missing skill's retrieval slot
would have held instead (the off side simply injects one skill fewer).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.contracts import Skill
from evolve.evidence import Evidence
from evolve.gate import Validator, replayable
from evolve.skill_md import parse_skill_md


@dataclass
class TaskImpact:
    turn_id: str
    session_id: str
    tenant: str
    changed: bool  # the run's publishes reached this task's injected skills
    on: float
    off: float


@dataclass
class Impact:
    tasks: list[TaskImpact] = field(default_factory=list)
    ungraded: int = 0

    def by(self, key: str) -> dict[str, dict[str, float]]:
        """{session id or tenant: {"on", "off", "tasks", "changed"}} (means over its graded tasks)."""
        acc: dict[str, list[TaskImpact]] = defaultdict(list)
        for t in self.tasks:
            acc[getattr(t, key)].append(t)
        return {k: {"on": sum(t.on for t in ts) / len(ts), "off": sum(t.off for t in ts) / len(ts),
                    "tasks": len(ts), "changed": sum(t.changed for t in ts)} for k, ts in acc.items()}

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": [asdict(t) for t in self.tasks], "ungraded": self.ungraded,
                "by_session": self.by("session_id"), "by_tenant": self.by("tenant")}


def served_and_undone(e: Evidence, library_then: Mapping[str, str | None],
                      undone: Mapping[str, str | None]) -> tuple[list[Skill], list[Skill]]:
    """(skills as injected into `e`, the same with the run undone). `library_then`: name -> SKILL.md text
    at the turn's generation; `undone`: name -> its text before the run (None: the run created it)."""
    on, off = [], []
    for name in e.skills:
        text = library_then.get(name)
        if text is None:
            continue  # not recorded by the bank's history (a folder added by hand): left out both ways
        on.append(parse_skill_md(text))
        before = undone[name] if name in undone else text
        if before is not None:
            off.append(parse_skill_md(before))
    return on, off


async def measure(validator: Validator, rows: Sequence[Evidence], state_at, undone: Mapping[str, str | None],
                  max_tasks: int = 64) -> Impact:
    """The impact of the changes in `undone` on `rows` (module docstring). `state_at(generation)` gives the
    library's texts at a generation (evolve/versions.py)."""
    out, libraries = Impact(), {}
    for e in replayable(rows)[-max_tasks:]:
        if e.skill_generation not in libraries:
            libraries[e.skill_generation] = state_at(e.skill_generation)
        on, off = served_and_undone(e, libraries[e.skill_generation], undone)
        changed = [s.model_dump() for s in on] != [s.model_dump() for s in off]
        a = await validator.replay(e, on)
        b = await validator.replay(e, off) if changed else a
        if a is None or b is None:
            out.ungraded += 1
            continue
        out.tasks.append(TaskImpact(e.turn_id, e.session_id, e.tenant, changed, a, b))
    return out
