"""The fast loop as a plain library: buffer scored turns, decide when to evolve, apply the result.

`EvolutionLoop` holds no Ray code (the `Evolver` actor in evolve/actor.py wraps it), so its trigger
logic is unit-testable. Per session it buffers the scored main turns since the session's last
evolution. Triggers (EvolverConfig), each needing at least `min_failures` failed turns (reward <= 0):
- `every_n_turns` main turns of a session (0 = off),
- the session's end (`turn.last_in_session`, when `on_session_end`),
- a failure rate of the buffered turns above `failure_rate_threshold`.
The failed turns of an evolution that changed the library (new or changed skills, a new generation) are
the support set: the replay buffer is told to mark them support (never trained on) and the new
generation. An evolution that only re-found known lessons leaves its turns as query samples.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from core.config import EvolverConfig
from core.contracts import Sample, Turn, TurnType
from evolve.bank import SkillBank
from evolve.evolvers import EvolveError, Evolver, Failure

log = logging.getLogger(__name__)


class ReplayLink(Protocol):
    """What the loop tells the replay buffer. Implementations must not raise."""

    async def mark_support(self, sample_ids: list[str]) -> None: ...

    async def set_generation(self, generation: int) -> None: ...


class NoReplay:
    async def mark_support(self, sample_ids: list[str]) -> None:
        pass

    async def set_generation(self, generation: int) -> None:
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


def _text(content: Any) -> str:
    """Message content as plain text: a string, or OpenAI / Anthropic content parts (text parts and
    the nested content of Anthropic `tool_result` parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") or _text(p.get("content")) for p in content if isinstance(p, dict)]
        return "\n".join(p for p in parts if p)
    return "" if content is None else str(content)


def failure_from(turn: Turn, sample: Sample) -> Failure:
    """The evolver's view of a failed turn: last user message, reply, and the next state as text."""
    user = next((m for m in reversed(turn.messages) if m.get("role") == "user"), {})
    response = turn.response_text
    if turn.tool_calls:
        response += "\n[tool calls] " + "; ".join(
            str((c.get("function") or {}).get("name", "")) + str((c.get("function") or {}).get("arguments", ""))
            for c in turn.tool_calls)
    feedback = "\n".join(_text(m.get("content")) for m in (turn.next_state or []))
    return Failure(instruction=_text(user.get("content")), response=response, feedback=feedback,
                   reward=float(sample.reward), session_id=turn.session_id, sample_id=sample.sample_id)


class EvolutionLoop:
    """Triggers + evolution + bookkeeping. Async because evolvers are; safe for concurrent calls."""

    def __init__(self, bank: SkillBank, cfg: EvolverConfig, evolver: Evolver,
                 replay: ReplayLink | None = None):
        self.bank, self.cfg, self.evolver = bank, cfg, evolver
        self.replay = replay or NoReplay()
        self._pending: dict[str, list[_Entry]] = {}
        self._turns: dict[str, int] = {}  # main turns seen per open session
        self._lock = asyncio.Lock()  # one evolution at a time: each sees the previous one's skills
        self.counters = {"turns_observed": 0, "evolutions_triggered": 0, "evolutions_accepted": 0,
                         "evolutions_rejected": 0, "skills_accepted": 0, "skills_rejected": 0,
                         "skills_merged": 0}
        self.last_error: str | None = None

    async def observe(self, turn: Turn, sample: Sample) -> EvolutionReport | None:
        """Buffer one scored turn; evolve if a trigger fires. Side turns are ignored."""
        if turn.turn_type != TurnType.main:
            return None
        sid = turn.session_id
        self.counters["turns_observed"] += 1
        failed = sample.reward <= 0
        entries = self._pending.setdefault(sid, [])
        entries.append(_Entry(sample.sample_id, failure_from(turn, sample) if failed else None))
        n = self._turns[sid] = self._turns.get(sid, 0) + 1
        trigger = self._trigger(entries, n, turn.last_in_session)
        if turn.last_in_session:  # the session is over: forget it whether or not it evolves
            self._turns.pop(sid, None)
        if trigger is None:
            if turn.last_in_session:
                self._pending.pop(sid, None)
            return None
        batch = self._pending.pop(sid, [])
        return await self._evolve(trigger, [e.failure for e in batch if e.failure is not None])

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

    def _trigger(self, entries: list[_Entry], n_turns: int, last: bool) -> str | None:
        fails = sum(e.failure is not None for e in entries)
        if fails < self.cfg.min_failures:
            return None
        if self.cfg.on_session_end and last:
            return "session_end"
        if self.cfg.every_n_turns and n_turns % self.cfg.every_n_turns == 0:
            return "every_n_turns"
        if fails / len(entries) > self.cfg.failure_rate_threshold:
            return "failure_rate"
        return None

    async def _evolve(self, trigger: str, failures: Sequence[Failure]) -> EvolutionReport:
        sessions = sorted({f.session_id for f in failures})
        report = EvolutionReport(trigger, sessions, len(failures))
        async with self._lock:
            self.counters["evolutions_triggered"] += 1
            self.bank.reload()
            try:
                skills = await self.evolver.evolve(list(failures), list(self.bank.skills()))
            except EvolveError as e:
                return self._rejected(report, str(e))
            report.produced = [s.name for s in skills]
            if not skills:
                return self._rejected(report, "the evolver produced no skill")
            result = self.bank.add_batch(skills, sessions, self.evolver.name, allow_updates=True)
        report.accepted, report.merged = result.accepted, result.merged
        report.rejected = {r.name: r.reason for r in result.rejected}
        report.generation = result.generation
        self.counters["skills_accepted"] += len(result.accepted)
        self.counters["skills_merged"] += len(result.merged)
        self.counters["skills_rejected"] += len(result.rejected)
        if not (result.accepted or result.merged):
            return self._rejected(report, "every produced skill was rejected by the bank")
        self.counters["evolutions_accepted"] += 1
        if result.accepted:
            # The support set: these failures changed S (a new generation), so they are never trained
            # on. Failures whose lessons S already had (merged: same content, no new generation) taught
            # nothing new and stay query samples of the current generation.
            await self.replay.mark_support([f.sample_id for f in failures])
            await self.replay.set_generation(result.generation)
        log.info("evolution (%s, %d failures): accepted %s, merged %s, rejected %s -> generation %d",
                 trigger, len(failures), result.accepted, result.merged, report.rejected, result.generation)
        return report

    def _rejected(self, report: EvolutionReport, why: str) -> EvolutionReport:
        self.counters["evolutions_rejected"] += 1
        report.error = self.last_error = why
        report.generation = self.bank.generation
        log.warning("evolution (%s) rejected: %s", report.trigger, why)
        return report
