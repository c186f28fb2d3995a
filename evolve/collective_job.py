"""The collective evolve job: every user's new sessions -> decisions -> the gate -> versioned publishes.

One run (`CollectiveJob.run`): read the evidence rows after the job's cursor (evolve/evidence.py), summarise
and group them by skill (evolve/collective.py), decide per group, replay each candidate A/B through the
gate (evolve/gate.py), and publish the approved ones as new versions of the SkillBank with their edit
summary, evidence and verdict (the bank's history is the audit log; every decision, rejections included,
is also kept in the evidence store's `decisions` table). Nothing is published unvalidated while the gate
is on; a rejected candidate changes nothing for anyone.

No lost update: a publish is a compare-and-swap on the skill's version (`expected_versions`): when
another writer (the per-user fast loop, a second job, `clawray skills`) changed the skill since the
decision was made, the bank refuses and the job decides again on the new base (`cas_retries` times),
never overwriting it. With the library in a bucket the same holds across hosts: the job publishes each
change to the bucket at once (`sync`), and a change another host published first wins there
(evolve/mirror.py); the job's change comes back as lost and is decided again on that version. The cursor is compare-and-swapped too (core/kv.py): a second job that read the same
rows decides on the library the first one published, so it does not publish the same change twice.

Support/query separation: before a publish the job claims the failed turns it learned from as support in
the replay buffer and opens the evolution fence (the `ReplayLink` of evolve/loop.py); the publish bumps
the generation and the fence closes with it, exactly as a fast-loop evolution does.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import CollectiveConfig
from core.contracts import Skill
from core.kv import Conflict, KVStore
from evolve.bank import SkillBank
from evolve.collective import NO_SKILL, Decision, SessionSummary, decide, group_by_skill, summarise_all
from evolve.evidence import EvidenceStore
from evolve.gate import StillIdle, Validator, Verdict
from evolve.loop import NoReplay, ReplayLink
from evolve.scopes import check_scope, scope_of

log = logging.getLogger(__name__)
Sync = Callable[[], Awaitable[list[str]]]
CURSOR_KEY = "collective.cursor"
FENCE_TTL_S = 120.0


@dataclass
class JobReport:
    job: str
    rows: int = 0
    sessions: int = 0
    session_ids: list[str] = field(default_factory=list)
    groups: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)  # action, skill, published, reason
    published: list[str] = field(default_factory=list)
    # Each published skill's version before this run (0: created by it): what undoing the run restores.
    published_from: dict[str, int] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    generation: int = 0
    cursor: int = 0
    skipped_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CollectiveJob:
    """See the module docstring. `validator` None = the gate is off (GateConfig.enabled false)."""

    def __init__(self, bank: SkillBank, store: EvidenceStore, cursor: KVStore, cfg: CollectiveConfig,
                 validator: Validator | None, replay: ReplayLink | None = None, name: str = "collective",
                 decider: Any = None, sync: Sync | None = None):
        self.bank, self.store, self.cursor, self.cfg = bank, store, cursor, cfg
        # With the library in a bucket (evolve/mirror.py): publish a change to it at once and return the
        # skills whose change lost to another host's published first (decided again, like a CAS conflict).
        self.sync = sync
        self.decider = decider  # evolve/collective_llm.py LLMDecider; None: the offline decisions
        self.validator, self.replay, self.name = validator, replay or NoReplay(), name
        if cfg.gate.enabled and validator is None:
            raise ValueError("the validation gate is on (evolver.collective.gate.enabled) but no validator was given")

    async def run(self, still_idle: StillIdle | None = None) -> JobReport:
        """One run. `still_idle`: a run that may only validate while serving is idle (evolve/gate.py) raises
        `GateYielded` once users are back; its cursor stays, so a later run decides those sessions again
        (on the library as it is then: what this run published before it stopped stays published)."""
        report = JobReport(f"{self.name}-{uuid.uuid4().hex[:8]}")
        got = self.cursor.get(CURSOR_KEY)
        version, start = (got[0], int(got[1]["seq"])) if got else (0, 0)
        rows = self.store.since(start, self.cfg.max_rows)
        report.rows, report.cursor = len(rows), start
        if not rows:
            report.skipped_reason = "no new sessions since the last run"
            report.generation = self.bank.generation
            return report
        last = rows[-1][0]
        evidence = [e for _, e in rows]
        sessions = summarise_all(evidence)
        self.bank.reload()
        groups = group_by_skill(sessions, self.bank.names())
        report.sessions, report.groups = len(sessions), len(groups)
        report.session_ids = [s.session_id for s in sessions]
        for group, members in groups.items():
            await self._group(report, group, members, last, still_idle)
        try:
            self.cursor.put(CURSOR_KEY, {"seq": last, "job": report.job, "ts": time.time()}, version)
            report.cursor = last
        except Conflict as e:  # another job moved it: its decisions saw what this one published
            log.info("collective job %s: cursor moved by another job (%s)", report.job, e)
        keep = self.cfg.decisions_retention_days
        self.store.prune(time.time() - self.cfg.retention_days * 86400, report.cursor,
                         time.time() - keep * 86400 if keep is not None else None)
        report.generation = self.bank.generation
        return report

    async def promote(self, name: str, scope: str) -> dict[str, Any]:
        """Serve skill `name` to a wider `scope` (e.g. a user's private lesson to its group, or to everyone)
        only if it passes the same gate: its owner's recorded tasks must show it helps (replayed without
        it vs with it) and tasks of other sessions, now in its audience, must not get worse."""
        report = JobReport(f"{self.name}-promote-{uuid.uuid4().hex[:8]}")
        check_scope(scope)
        self.bank.reload()
        skill = self.bank.get(name)
        if skill is None:
            raise ValueError(f"no skill named {name!r}")
        if scope_of(skill) == scope:
            raise ValueError(f"{name!r} already has scope {scope!r}")
        rows = [e for _, e in self.store.since(max(self.store.last_seq() - self.cfg.max_rows, 0), self.cfg.max_rows)]
        used = [e for e in rows if name in e.used]
        sessions = summarise_all(used)
        cand = skill.model_copy(update={"metadata": {**skill.metadata, "scope": scope}})
        d = Decision(name, "promote", f"promote {name!r} from {scope_of(skill)} to {scope}: the text is kept; "
                     f"evidence: {len(used)} turn(s) of {len(sessions)} session(s) that used it",
                     cand, self.bank.version_of(name), {"sessions": [s.session_id for s in sessions],
                                                       "from": scope_of(skill), "to": scope})
        if self.validator is None:
            v = Verdict(True, "the gate is off (evolver.collective.gate.enabled: false): not validated")
        else:
            held = self.store.sample_outside([s.session_id for s in sessions], self.cfg.gate.held_back)
            v = await self.validator.validate(skill, None, used, held)
        if not v.approved:
            self._record(report, d, v, False, f"rejected by the gate: {v.reason}")
        else:
            outcome = await self._publish(d, v, sessions)
            self._record(report, d, v, outcome == "published", outcome)
        report.generation = self.bank.generation
        return report.as_dict()

    async def _group(self, report: JobReport, group: str, members: list[SessionSummary], last_seq: int,
                     still_idle: StillIdle | None = None) -> None:
        for attempt in range(self.cfg.cas_retries + 1):
            self.bank.reload()
            library = self.bank.skills()
            bases = {s.name: self.bank.version_of(s.name) for s in library}  # read with the library, before any await
            d = decide(group, members, library, min_sessions=self.cfg.min_sessions)
            if self.decider is not None and (d.action != "skip" or any(s.failures for s in members)):
                d = await self.decider.decide(group, members, library, d)
            if d.candidate is not None and d.action != "create":
                d.base_version = bases.get(d.candidate.name, 0)  # the bank's counter: what CAS compares
            if d.action == "skip" or d.candidate is None:
                self._record(report, d, None, False, d.summary)
                return
            v = await self._validate(d, members, last_seq, still_idle)
            if not v.approved:
                self._record(report, d, v, False, f"rejected by the gate: {v.reason}")
                return
            outcome = await self._publish(d, v, members)
            if outcome == "conflict":
                log.info("collective job %s: %s changed since the decision; deciding again (%d/%d)",
                         report.job, d.candidate.name, attempt + 1, self.cfg.cas_retries)
                continue
            self._record(report, d, v, outcome == "published", outcome)
            return
        self._record(report, d, None, False, f"gave up after {self.cfg.cas_retries} compare-and-swap conflicts")

    async def _validate(self, d: Decision, members: list[SessionSummary], last_seq: int,
                        still_idle: StillIdle | None = None) -> Verdict:
        assert d.candidate is not None
        if self.validator is None:
            return Verdict(True, "the gate is off (evolver.collective.gate.enabled: false): not validated")
        current = self.bank.get(d.candidate.name) if d.action != "create" else None
        tasks = [e for s in members for e in s.rows]
        held = self.store.sample_outside([s.session_id for s in members], self.cfg.gate.held_back, last_seq)
        return await self.validator.validate(d.candidate, current, tasks, held, still_idle)

    async def _publish(self, d: Decision, v: Verdict, members: list[SessionSummary]) -> str:
        """"published", "conflict" or the bank's reason for refusing."""
        cand: Skill = d.candidate  # type: ignore[assignment]
        failed = [e.turn_id for s in members for e in s.rows if e.failed]
        token, claimed = await self.replay.begin_evolution(failed, FENCE_TTL_S)
        generation, release = None, claimed  # nothing published: the claimed failures go back
        try:
            notes = {cand.name: {"summary": d.summary, "evidence": d.evidence, "validation": v.as_dict(),
                                 "base_version": d.base_version, "decision": d.action}}
            result = self.bank.add_batch([cand], [s.session_id for s in members], self.name, allow_updates=True,
                                         expected_versions={cand.name: d.base_version}, notes=notes)
            if result.conflicts:
                return "conflict"
            if result.rejected:
                return f"refused by the bank: {result.rejected[0].reason}"
            if not result.accepted:
                return "unchanged (the library already holds this text)"
            generation = result.generation
            if self.sync is not None and cand.name in await self.sync():
                # Another host published a change of this skill first: its version is in the folder now, as
                # a new generation (which the fence announces); this candidate is decided again on it.
                self.bank.reload()
                generation = self.bank.generation
                return "conflict"
            release = []
            return "published"
        finally:
            await self.replay.end_evolution(token, generation, release)

    def _record(self, report: JobReport, d: Decision, v: Verdict | None, published: bool, outcome: str) -> None:
        name = d.candidate.name if d.candidate is not None else d.group
        rec = {"group": d.group or "(no skill)", "summary": d.summary, "evidence": d.evidence,
               "base_version": d.base_version, "outcome": outcome,
               "verdict": v.as_dict() if v is not None else None,
               "candidate": d.candidate.model_dump() if d.candidate is not None and not published else None}
        self.store.record_decision(report.job, name, d.action, published, rec)
        report.decisions.append({"skill": name, "group": d.group or "(no skill)", "action": d.action,
                                 "published": published, "outcome": outcome, "summary": d.summary})
        if published:
            report.published.append(name)
            report.published_from.setdefault(name, int(d.base_version or 0) if d.action != "create" else 0)
        elif d.action != "skip":
            report.rejected.append(name)
        log.info("collective job %s: %s %s -> %s", report.job, d.action, name or NO_SKILL, outcome)

