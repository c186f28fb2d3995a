"""The validation gate: a candidate skill is published only if replaying recorded tasks shows it helps.

For each task (a recorded turn with a programmatic check: its messages with the injected skills block
removed, evolve/evidence.py) the gate asks the serving engine for a greedy reply twice, once with the
current version of the skill injected (nothing, for a new skill) and once with the candidate, and grades
both replies with the PRM's own checkers/judge (`PRM.grade`). The group's own tasks must show the
candidate is better; a few held-back tasks of other sessions (the candidate injected there too, the worst
case for retrieval) must not get worse, so a change cannot help one group by hurting another.

`verdict` is the arithmetic, pure and unit-tested. SkillClaw's defaults (GateConfig): at least 1 graded
result, 1 approval, candidate mean >= 0.75; here also: candidate mean > current mean + margin, and the
held-back mean may not drop by more than `held_back_tolerance`. An approval is a task where the
candidate's grade beats the current one's, or matches it at a passing grade (>= min_mean).

`Validator` runs the replays with two injected callables (the composition root wires the engine's Serve
handle and the PRM actor; evolve/ imports neither plane): `generate(messages, max_tokens) -> str` and
`grade(messages, reply, eval_spec, files) -> float | None` (None: nothing could grade it; left out).
With a sandbox (evolve/sandbox.py) and a `chat` callable, a task whose request offered tools the sandbox
has is replayed with them, and graded on the reply and the files the replay left (`files`; None for a
reply-only replay).

Replays share the engine with users' turns. A run that may only validate while serving is idle passes
`still_idle` (an async predicate: the OMLS idle signals, evolve/collective_runner.py): it is asked right
before every engine call, and once it says no the run stops with `GateYielded` (the replays already in
flight, at most `concurrency`, finish), so users who come back wait for no more than those.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import GateConfig
from core.contracts import Skill
from evolve.evidence import Evidence
from evolve.retrieval import render_skills_block
from evolve.sandbox import Chat, Sandbox, SandboxError, task_messages

Generate = Callable[[list[dict[str, Any]], int], Awaitable[str]]
Grade = Callable[[list[dict[str, Any]], str, dict[str, Any] | None, dict[str, bytes] | None],
                 Awaitable[float | None]]
StillIdle = Callable[[], Awaitable[bool]]


class GateYielded(RuntimeError):
    """A run that validates only while serving is idle stopped before its next replay: users came back."""


@dataclass
class TaskResult:
    turn_id: str
    session_id: str
    held_back: bool
    current: float
    candidate: float


@dataclass
class Verdict:
    approved: bool
    reason: str
    results: int = 0  # graded tasks of the group
    approvals: int = 0
    current_mean: float = 0.0
    candidate_mean: float = 0.0
    held_back_results: int = 0
    held_back_current: float = 0.0
    held_back_candidate: float = 0.0
    ungraded: int = 0  # replays nothing could grade (left out)
    tasks: list[TaskResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def verdict(results: Sequence[TaskResult], cfg: GateConfig, ungraded: int = 0) -> Verdict:
    """Whether the candidate passes, with the numbers and the first failed condition as the reason."""
    own = [r for r in results if not r.held_back]
    back = [r for r in results if r.held_back]
    approvals = sum(r.candidate > r.current or (r.candidate == r.current and r.candidate >= cfg.min_mean)
                    for r in own)
    v = Verdict(False, "", len(own), approvals, _mean([r.current for r in own]), _mean([r.candidate for r in own]),
                len(back), _mean([r.current for r in back]), _mean([r.candidate for r in back]), ungraded,
                list(results))
    if len(own) < cfg.min_results:
        v.reason = f"{len(own)} graded task(s) of the group < min_results {cfg.min_results}"
    elif approvals < cfg.min_approvals:
        v.reason = f"{approvals} approval(s) < min_approvals {cfg.min_approvals}"
    elif v.candidate_mean < cfg.min_mean:
        v.reason = f"candidate mean {v.candidate_mean:.3f} < min_mean {cfg.min_mean}"
    elif v.candidate_mean <= v.current_mean + cfg.margin:
        v.reason = (f"candidate mean {v.candidate_mean:.3f} does not beat the current {v.current_mean:.3f} "
                    f"by more than margin {cfg.margin}")
    elif back and v.held_back_candidate < v.held_back_current - cfg.held_back_tolerance:
        v.reason = (f"held-back tasks got worse: {v.held_back_current:.3f} -> {v.held_back_candidate:.3f} "
                    f"(tolerance {cfg.held_back_tolerance})")
    else:
        v.approved = True
        v.reason = (f"approved: {approvals}/{len(own)} task(s), mean {v.current_mean:.3f} -> "
                    f"{v.candidate_mean:.3f}" + (f", held-back {v.held_back_current:.3f} -> "
                                                 f"{v.held_back_candidate:.3f}" if back else ""))
    return v


def with_skill(messages: Sequence[dict[str, Any]], skill: Skill | None) -> list[dict[str, Any]]:
    """`messages` with `skill` injected as the Proxy injects skills (appended to the system message)."""
    return with_skills(messages, [skill] if skill is not None else [])


def with_skills(messages: Sequence[dict[str, Any]], skills: Sequence[Skill]) -> list[dict[str, Any]]:
    """`messages` with `skills` injected as the Proxy injects them (one block appended to the system message)."""
    out = copy.deepcopy(list(messages))
    if not skills:
        return out
    block = render_skills_block(list(skills))
    if out and out[0].get("role") in ("system", "developer"):
        content = out[0].get("content")
        if isinstance(content, list):
            out[0]["content"] = [*content, {"type": "text", "text": block}]
        else:
            out[0]["content"] = f"{content}\n\n{block}" if content else block
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def replayable(rows: Sequence[Evidence]) -> list[Evidence]:
    """Rows the gate can replay: a recorded request and a check to grade the reply with."""
    return [e for e in rows if e.messages and e.eval_spec]


class Validator:
    """A/B replays through the engine, graded by the PRM (module docstring)."""

    def __init__(self, cfg: GateConfig, generate: Generate, grade: Grade, concurrency: int = 2,
                 chat: Chat | None = None, sandbox: Sandbox | None = None):
        self.cfg, self.generate, self.grade = cfg, generate, grade
        self.chat, self.sandbox = chat, sandbox
        self._sem = asyncio.Semaphore(concurrency)

    async def validate(self, candidate: Skill, current: Skill | None, tasks: Sequence[Evidence],
                       held_back: Sequence[Evidence] = (), still_idle: StillIdle | None = None) -> Verdict:
        """The verdict on `candidate` against `current`; raises `GateYielded` when `still_idle` says no."""
        jobs = [(e, False) for e in self._distinct(replayable(tasks))[-self.cfg.max_tasks:]]
        jobs += [(e, True) for e in self._distinct(replayable(held_back))[: self.cfg.held_back]]
        if not jobs:
            return verdict([], self.cfg)
        outs = await asyncio.gather(*(self._one(e, back, candidate, current, still_idle) for e, back in jobs))
        results = [r for r in outs if r is not None]
        return verdict(results, self.cfg, ungraded=len(outs) - len(results))

    def _with_tools(self, e: Evidence) -> bool:
        return self.sandbox is not None and self.chat is not None and bool(self.sandbox.offered(e.tools))

    def _distinct(self, rows: Sequence[Evidence]) -> list[Evidence]:
        """`rows`, each task once: an agent's tool steps are turns of one task, which a replay with tools
        runs from the task's start, so only the last recorded step of it is kept."""
        last: dict[tuple[str, int], int] = {}
        for i, e in enumerate(rows):
            if self._with_tools(e):
                last[(e.session_id, len(task_messages(e.messages)))] = i
        kept = set(last.values())
        return [e for i, e in enumerate(rows) if i in kept or not self._with_tools(e)]

    async def _one(self, e: Evidence, back: bool, candidate: Skill, current: Skill | None,
                   still_idle: StillIdle | None) -> TaskResult | None:
        # Held-back tasks compare the candidate against the library as it is for them: no candidate.
        base = None if back else current
        a, b = await asyncio.gather(self._run(e, base, still_idle), self._run(e, candidate, still_idle))
        if a is None or b is None:
            return None
        return TaskResult(e.turn_id, e.session_id, back, a, b)

    async def _run(self, e: Evidence, skill: Skill | None, still_idle: StillIdle | None) -> float | None:
        return await self.replay(e, [skill] if skill is not None else [], still_idle)

    async def replay(self, e: Evidence, skills: Sequence[Skill], still_idle: StillIdle | None = None) -> float | None:
        """Task `e` replayed once with `skills` injected (with its tools where it offered them), graded in
        [0, 1]; None when nothing could grade it. `still_idle`: asked right before the engine call."""
        messages = with_skills(e.messages, skills)
        if self._with_tools(e):
            try:
                start = self.sandbox.start_for(e.eval_spec)
                async with self._sem:
                    await self._check_idle(still_idle)
                    reply, files = await self.sandbox.replay(self.chat, messages, e.tools, self.cfg.max_tokens,
                                                             start)
            except SandboxError:  # its snapshot is gone, or its workspace grew past what the grader is sent
                return None
            return await self.grade(messages, reply, e.eval_spec, files)
        async with self._sem:
            await self._check_idle(still_idle)
            reply = await self.generate(messages, self.cfg.max_tokens)
        return await self.grade(messages, reply, e.eval_spec, None)

    @staticmethod
    async def _check_idle(still_idle: StillIdle | None) -> None:
        if still_idle is not None and not await still_idle():
            raise GateYielded("serving is no longer idle (an OMLS idle signal closed): the run stopped before "
                              "its next replay and is resumed in a later idle window")
