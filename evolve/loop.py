"""The fast loop as a plain library: buffer scored turns, decide when to evolve, apply the result.

`EvolutionLoop` holds no Ray code (the `Evolver` actor in evolve/actor.py wraps it), so its trigger
logic is unit-testable. Per session it buffers the scored main turns since the session's last
evolution. Triggers (EvolverConfig), each needing at least `min_failures` failed turns (reward <= 0):
- `every_n_turns` main turns of a session (0 = off),
- the session's end (`turn.last_in_session`, when `on_session_end`); an idle flush (`turn.idle_flushed`)
  is not an end: the conversation only went quiet, so its buffer stays open (the oldest open sessions are
  forgotten beyond `MAX_OPEN_SESSIONS`),
- a failure rate of the buffered turns above `failure_rate_threshold`.
An ended session whose failures fired no trigger keeps them (within the same bound) for a manual
evolution (`evolve_now`, the `Evolver` actor's manual trigger; the demo's midday evolution uses it).
A sample is observed once: the outbox re-delivers a turn whose acknowledgement was lost and the PRM
notifies after every successful store, so repeats of a sample id are ignored (the last
`MAX_OBSERVED_IDS` ids are remembered, in memory: after an Evolver restart a repeat may count again).
Support/query separation under overlap (train/replay_store.py): an evolution first claims its failures
as support in the replay buffer and opens a fence (`begin_evolution`), BEFORE the evolver runs and the
bank writes a new generation; it evolves from the claimed failures only (one already trained, or sealed
by a training step, cannot become support and is left out); then it writes the bank and closes the fence
(`end_evolution`) with the new generation when S changed. An evolution that changed nothing (only
merges: lessons S already had, a rejection, an error) hands its claims back as query samples. Failures
the evolver cannot learn from (`Evolver.teaches`: for the feedback evolver, no rule-like feedback followed
the turn, as in every single-turn session) are never claimed; when none can teach, no fence opens. The
evolver runs within the fence's budget (`fence_ttl_s`), so a fence never expires under a live evolution.
The bank's generation never goes back (`reconcile`): a wiped or replaced skills folder is written up to
a new generation above the highest one seen, so Replay never silently retires every new sample.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from core.agent_context import AGENT_CONTEXT_MARKERS
from core.config import EvolverConfig
from core.contracts import Sample, Skill, Turn, TurnType
from evolve.bank import BatchResult, SkillBank
from evolve.evidence import turn_texts
from evolve.evolvers import EvolveError, Evolver, Failure
from evolve.scopes import GLOBAL, private_name, scope_of, tenant_scope, visible
from evolve.skill_md import content_key

log = logging.getLogger(__name__)
MAX_OBSERVED_IDS = 100_000  # sample ids remembered to ignore re-deliveries
MAX_OPEN_SESSIONS = 10_000  # sessions buffered at once (quiet ones never end explicitly)


LLM_EVOLVER_ATTEMPTS = 3  # LLMEvolver's max_attempts: chat calls per evolution, each with client retries
FENCE_SLACK_S = 30.0  # fence time left for the bank write and end_evolution after the evolver's budget


def fence_ttl_s(cfg: EvolverConfig) -> float:
    """How long an evolution may hold its replay fence: the evolver's worst case (every LLM attempt
    timing out after all retries and backoffs) plus slack. A crashed evolver blocks training seals this
    long at most."""
    if cfg.llm is None:
        return 120.0
    e = cfg.llm
    per_call = (e.max_retries + 1) * e.timeout_s + e.backoff_s * 2 ** e.max_retries
    return LLM_EVOLVER_ATTEMPTS * per_call + 2 * FENCE_SLACK_S


class ReplayLink(Protocol):
    """What the loop tells the replay buffer (see the module docstring). Implementations must not raise:
    a buffer that cannot be told claims nothing."""

    async def begin_evolution(self, sample_ids: list[str], ttl_s: float) -> tuple[str | None, list[str]]: ...

    async def end_evolution(self, token: str | None, generation: int | None, release_ids: list[str]) -> None: ...


class NoReplay:
    """No replay buffer (skills-only deployments): every failure may be evolved from."""

    async def begin_evolution(self, sample_ids: list[str], ttl_s: float) -> tuple[str | None, list[str]]:
        return None, list(sample_ids)

    async def end_evolution(self, token: str | None, generation: int | None, release_ids: list[str]) -> None:
        pass


@dataclass
class EvolutionReport:
    trigger: str  # every_n_turns | session_end | failure_rate | manual
    sessions: list[str]
    failures: int
    produced: list[str] = field(default_factory=list)  # skill names the evolver returned
    accepted: list[str] = field(default_factory=list)  # written with new content
    merged: list[str] = field(default_factory=list)  # same content, metadata merged
    rejected: dict[str, str] = field(default_factory=dict)  # name -> reason
    generation: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Entry:
    sample_id: str
    failure: Failure | None  # None for a successful turn


def by_scope(failures: Sequence[Failure], level: str,
             groups: dict[str, list[str]] | None = None) -> dict[str, list[Failure]]:
    """Failures by the scope their lesson is written at (`evolver.scope`), in first-seen order."""
    out: dict[str, list[Failure]] = {}
    for f in failures:
        out.setdefault(tenant_scope(f.tenant, level, groups), []).append(f)
    return out


def failure_from(turn: Turn, sample: Sample, markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> Failure:
    """The evolver's view of a failed turn: the user's instruction (evolve/evidence.py `turn_texts`), the
    reply, and the next state as text."""
    instruction, response, feedback = turn_texts(turn, markers)
    return Failure(instruction=instruction, response=response, feedback=feedback,
                   reward=float(sample.reward), session_id=turn.session_id, sample_id=sample.sample_id,
                   tenant=turn.tenant)


class EvolutionLoop:
    """Triggers + evolution + bookkeeping. Async because evolvers are; safe for concurrent calls."""

    def __init__(self, bank: SkillBank, cfg: EvolverConfig, evolver: Evolver,
                 replay: ReplayLink | None = None, fence_ttl: float | None = None,
                 markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS):
        self.bank, self.cfg, self.evolver = bank, cfg, evolver
        self.markers = tuple(markers)  # what in a user message is the agent's (core/agent_context.py)
        self.replay = replay or NoReplay()
        self.fence_ttl = fence_ttl_s(cfg) if fence_ttl is None else fence_ttl
        self._pending: dict[str, list[_Entry]] = {}
        self._turns: dict[str, int] = {}  # main turns seen per open session, least recently seen first
        self._observed: OrderedDict[str, None] = OrderedDict()  # sample ids seen, oldest first
        self._lock = asyncio.Lock()  # one evolution at a time: each sees the previous one's skills
        self.counters = {"turns_observed": 0, "evolutions_triggered": 0, "evolutions_accepted": 0,
                         "evolutions_rejected": 0, "skills_accepted": 0, "skills_rejected": 0,
                         "skills_merged": 0}
        self.last_error: str | None = None

    @property
    def lock(self) -> asyncio.Lock:
        """Held by every evolution: other writers of the bank (the collective job) take it too."""
        return self._lock

    async def observe(self, turn: Turn, sample: Sample) -> EvolutionReport | None:
        """Buffer one scored turn; evolve if a trigger fires. Side turns and samples already observed
        are ignored."""
        if turn.turn_type != TurnType.main or not self._first_sight(sample.sample_id):
            return None
        sid = turn.session_id
        self.counters["turns_observed"] += 1
        failed = sample.reward <= 0
        entries = self._open(sid)
        entries.append(_Entry(sample.sample_id, failure_from(turn, sample, self.markers) if failed else None))
        n = self._turns[sid] = self._turns[sid] + 1
        ended = turn.last_in_session and not turn.idle_flushed  # an idle flush is not the session's end
        trigger = self._trigger(entries, n, ended)
        if ended:  # the session is over: forget it whether or not it evolves
            self._turns.pop(sid, None)
        if trigger is None:
            if ended and not any(e.failure is not None for e in entries):
                self._pending.pop(sid, None)  # nothing left to learn from; failures wait for evolve_now
            return None
        batch = self._pending.pop(sid, [])
        return await self._evolve(trigger, [e.failure for e in batch if e.failure is not None])

    def _first_sight(self, sample_id: str) -> bool:
        if sample_id in self._observed:
            return False
        self._observed[sample_id] = None
        if len(self._observed) > MAX_OBSERVED_IDS:
            self._observed.popitem(last=False)
        return True

    def _open(self, sid: str) -> list[_Entry]:
        """The session's buffer, the session marked most recently seen; beyond MAX_OPEN_SESSIONS the
        least recently seen session is forgotten (sessions that go quiet never end explicitly)."""
        self._turns[sid] = self._turns.pop(sid, 0)
        entries = self._pending[sid] = self._pending.pop(sid, [])
        while len(self._turns) > MAX_OPEN_SESSIONS:
            oldest = next(iter(self._turns))
            self._turns.pop(oldest)
            self._pending.pop(oldest, None)
        while len(self._pending) > MAX_OPEN_SESSIONS:  # ended sessions' unused failures, oldest first
            self._pending.pop(next(iter(self._pending)))
        return entries

    async def evolve_now(self, session_id: str | None = None) -> EvolutionReport | None:
        """Evolve from the buffered failures of one session (or all) now, ignoring the triggers."""
        sids = [session_id] if session_id is not None else list(self._pending)
        failures = [e.failure for s in sids for e in self._pending.pop(s, []) if e.failure is not None]
        if not failures:
            return None
        return await self._evolve("manual", failures)

    def pending(self) -> dict[str, int]:
        """Buffered failed turns per session."""
        return {s: sum(e.failure is not None for e in es) for s, es in self._pending.items()}

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "skills": len(self.bank), "generation": self.bank.generation,
                "pending_failures": sum(self.pending().values()), "evolver": self.evolver.name,
                "last_error": self.last_error}

    def _trigger(self, entries: list[_Entry], n_turns: int, ended: bool) -> str | None:
        fails = sum(e.failure is not None for e in entries)
        if fails < self.cfg.min_failures:
            return None
        if self.cfg.on_session_end and ended:
            return "session_end"
        if self.cfg.every_n_turns and n_turns % self.cfg.every_n_turns == 0:
            return "every_n_turns"
        if fails / len(entries) > self.cfg.failure_rate_threshold:
            return "failure_rate"
        return None

    async def _evolve(self, trigger: str, failures: Sequence[Failure]) -> EvolutionReport:
        report = EvolutionReport(trigger, sorted({f.session_id for f in failures}), len(failures))
        teaching = [f for f in failures if self.evolver.teaches(f)]
        if not teaching:  # nothing to learn from: claim nothing (a fence would block training seals)
            self.counters["evolutions_triggered"] += 1
            report.failures, report.sessions = 0, []
            return self._rejected(report, f"no failure carries a lesson the {self.evolver.name} evolver "
                                          "can learn from (no feedback followed it)", level=logging.INFO)
        failures = teaching
        async with self._lock:
            self.counters["evolutions_triggered"] += 1
            token, claimed = await self.replay.begin_evolution([f.sample_id for f in failures], self.fence_ttl)
            mine = set(claimed)
            usable = [f for f in failures if f.sample_id in mine]
            if len(usable) < len(failures):
                log.info("evolution (%s): %d of %d failure(s) left out: already trained (or sealed by a "
                         "training step), or the replay buffer could not be told", trigger,
                         len(failures) - len(usable), len(failures))
            report.failures, report.sessions = len(usable), sorted({f.session_id for f in usable})
            generation, result = None, None
            try:
                result = await self._run(report, usable)
                generation = result.generation if result is not None and result.accepted else None
            finally:
                # S changed: the claimed failures stay support and the new generation retires older
                # samples. Otherwise (merges only, rejected, error) they taught nothing: back to query.
                await self.replay.end_evolution(token, generation, [] if generation is not None else claimed)
        if result is None:
            return report
        log.info("evolution (%s, %d failures): accepted %s, merged %s, rejected %s -> generation %d",
                 trigger, len(usable), result.accepted, result.merged, report.rejected, result.generation)
        return report

    async def _run(self, report: EvolutionReport, failures: list[Failure]) -> BatchResult | None:
        """Evolver + bank write, inside the fence; None when rejected (the report says why)."""
        if not failures:
            self._rejected(report, "no failure could be claimed as support (already trained?)")
            return None
        self.reconcile()
        budget = max(self.fence_ttl - FENCE_SLACK_S, self.fence_ttl / 2)
        deadline = time.monotonic() + budget
        skills: list[Skill] = []
        try:
            for scope, group in by_scope(failures, self.cfg.scope, self.bank.cfg.groups).items():
                seen = [s for s in self.bank.skills() if scope == GLOBAL or visible(s, frozenset({scope}))]
                out = await asyncio.wait_for(self.evolver.evolve(group, seen),
                                             max(deadline - time.monotonic(), 0.001))
                skills += [self._scoped(s, scope) for s in out]
        except EvolveError as e:
            self._rejected(report, str(e))
            return None
        except TimeoutError:
            self._rejected(report, f"the evolver took longer than its fence budget ({budget:.0f} s)")
            return None
        report.produced = [s.name for s in skills]
        if not skills:
            self._rejected(report, "the evolver produced no skill")
            return None
        result = self.bank.add_batch(skills, report.sessions, self.evolver.name, allow_updates=True)
        report.accepted, report.merged = result.accepted, result.merged
        report.rejected = {r.name: r.reason for r in result.rejected}
        report.generation = result.generation
        self.counters["skills_accepted"] += len(result.accepted)
        self.counters["skills_merged"] += len(result.merged)
        self.counters["skills_rejected"] += len(result.rejected)
        if not (result.accepted or result.merged):
            self._rejected(report, "every produced skill was rejected by the bank")
            return None
        self.counters["evolutions_accepted"] += 1
        return result

    def _scoped(self, skill: Skill, scope: str) -> Skill:
        """A produced skill as the lesson of `scope`: a new one gets the scope; one that would change a
        skill of another scope (a global one, another user's) becomes a new skill of this scope instead,
        under a name of its own, so one user's failure never rewrites what others are served."""
        if scope == GLOBAL:
            return skill
        old = self.bank.get(skill.name)
        if old is not None and (scope_of(old) == scope
                                or (scope_of(old) == GLOBAL and content_key(old) == content_key(skill))):
            return skill  # its own skill refined, or a global lesson it already had (a metadata-only merge)
        name = skill.name if old is None else private_name(skill.name, scope, self.bank.names())
        return skill.model_copy(update={"name": name, "metadata": {**skill.metadata, "scope": scope}})

    def reconcile(self, floor: int = 0) -> int:
        """Keep the generation monotonic: when the skills folder went back (wiped or replaced: its
        generation is below one already seen, or below `floor`, e.g. Replay's), write a NEW generation
        above both, since S changed. Returns the bank's generation."""
        self.bank.reload()
        if self.bank.disk_generation < max(self.bank.generation, floor):
            return self.bank.ensure_generation(floor, evolver=self.evolver.name)
        return self.bank.generation

    def _rejected(self, report: EvolutionReport, why: str, level: int = logging.WARNING) -> EvolutionReport:
        self.counters["evolutions_rejected"] += 1
        report.error = self.last_error = why
        report.generation = self.bank.generation
        log.log(level, "evolution (%s) rejected: %s", report.trigger, why)
        return report
