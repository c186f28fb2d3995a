"""What the `Evolver` actor runs of collective evolution: evidence recording, the job, its schedule.

- `record(pairs)`: each scored main turn the Evolver observes becomes an evidence row (evolve/evidence.py).
- `run(now)`: one `CollectiveJob` run (evolve/collective_job.py). Scheduled runs (every
  `interval_s`, `start()`) go ahead only while serving is idle: the OMLS actor reports an open idle signal
  (sleep hours, inactivity, a calendar event), and the gate asks it again before every replay, so a run
  stops (`GateYielded`, counted as `yielded`) as soon as users are back: the gate's replays never compete
  with users' turns for longer than the replays already in flight. `clawray skills evolve --now` is an
  operator's explicit request and runs at once.
- The gate's two callables, wired by name from what the composition root passed (evolve/ imports neither
  plane): `ServeGenerate` asks the engine deployment (Serve handle; greedy, the policy alias, so
  the active adapter) and `PrmGrade` asks a PRM actor (`PRM.grade`: the same checkers and judge that
  score users' turns).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from pathlib import Path
from typing import Any

from core import names
from core.agent_context import AGENT_CONTEXT_MARKERS
from core.config import CollectiveConfig, LLMEndpoint
from core.contracts import Sample, Turn, TurnType
from core.kv import control_store
from evolve.bank import SkillBank
from evolve.collective_job import CollectiveJob, JobReport, Sync
from evolve.evidence import EvidenceStore, evidence_from
from evolve.gate import GateYielded, Validator
from evolve.loop import ReplayLink
from evolve.sandbox import Sandbox

log = logging.getLogger(__name__)


class GateUnavailable(RuntimeError):
    """The engine or the PRM could not answer a replay now (retry the run later)."""


class ServeGenerate:
    """`generate(messages, max_tokens) -> reply text` through the engine deployment's `chat`; `chat(messages,
    tools, max_tokens) -> the assistant message` for replays with tools (evolve/sandbox.py)."""

    def __init__(self, deployment: str, app: str, model: str, timeout_s: float):
        self.deployment, self.app, self.model, self.timeout_s = deployment, app, model, timeout_s
        self._handle: Any = None

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   max_tokens: int) -> dict[str, Any]:
        from ray import serve

        if self._handle is None:
            self._handle = serve.get_deployment_handle(self.deployment, app_name=self.app)
        body = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": max_tokens,
                **({"tools": tools} if tools else {})}
        try:
            reply = await asyncio.wait_for(self._handle.chat.remote(body), self.timeout_s)
        except Exception as e:  # noqa: BLE001 - down, asleep for training, refused: the run is retried later
            raise GateUnavailable(f"the engine could not replay a task: {type(e).__name__}: {str(e)[:200]}") from e
        choices = reply.body.get("choices") or [{}]
        return choices[0].get("message") or {}

    async def __call__(self, messages: list[dict[str, Any]], max_tokens: int) -> str:
        return (await self.chat(messages, None, max_tokens)).get("content") or ""


class PrmGrade:
    """`grade(messages, reply, eval_spec, files) -> float | None` on a PRM actor of the pool."""

    def __init__(self, prms: list[str], namespace: str, timeout_s: float):
        self.prms, self.namespace, self.timeout_s = prms, namespace, timeout_s

    async def __call__(self, messages: list[dict[str, Any]], reply: str, eval_spec: dict[str, Any] | None,
                       files: dict[str, bytes] | None = None) -> float | None:
        name = self.prms[zlib.crc32(reply.encode()) % len(self.prms)]
        try:
            handle = names.actor(name, self.namespace, timeout_s=self.timeout_s)
            with names.forget_if_dead(name, self.namespace):
                return await asyncio.wait_for(handle.grade.remote(messages, reply, eval_spec, files), self.timeout_s)
        except Exception as e:  # noqa: BLE001 - a PRM down or its judge unavailable: retry the run later
            raise GateUnavailable(f"{name} could not grade a replay: {type(e).__name__}: {str(e)[:200]}") from e


class CollectiveRunner:
    """Args: the bank the Evolver writes, the config section, the storage root and state config (for the
    evidence store and the job's cursor), the replay link, and `gate`: {"engine": {deployment, app,
    model}, "prms": [names], "namespace"} (None: no gate can be wired, so the job runs only with the gate
    off); `sync`: publishes the library to its bucket now, returning the skills whose change lost to another
    host's (the Evolver's, when the library is mirrored; evolve/collective_job.py)."""

    def __init__(self, bank: SkillBank, cfg: CollectiveConfig, storage_root: str, state: dict | None,
                 replay: ReplayLink, gate: dict[str, Any] | None, omls: tuple[str, str] | None = None,
                 llm: LLMEndpoint | None = None, lock: asyncio.Lock | None = None, sync: Sync | None = None,
                 markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS):
        self.cfg, self.bank, self.omls = cfg, bank, omls
        self.markers = tuple(markers)  # what in a user message is the agent's (core/agent_context.py)
        self.store = EvidenceStore(Path(storage_root), state)
        validator = None
        if cfg.gate.enabled and gate is not None:
            eng = gate["engine"]
            generate = ServeGenerate(eng["deployment"], eng["app"], eng["model"], cfg.gate.timeout_s)
            sandbox = Sandbox(cfg.gate.sandbox) if cfg.gate.sandbox is not None else None
            validator = Validator(cfg.gate, generate, PrmGrade(list(gate["prms"]), gate["namespace"], cfg.gate.timeout_s),
                                  chat=generate.chat, sandbox=sandbox)
        decider = None
        if cfg.llm or llm:
            from core.llm import LLMClient
            from evolve.collective_llm import LLMDecider

            decider = LLMDecider(LLMClient(cfg.llm or llm))
        self.job = (CollectiveJob(bank, self.store, control_store(storage_root, state), cfg, validator, replay,
                                  decider=decider, sync=sync)
                    if validator is not None or not cfg.gate.enabled else None)
        # Every run and promotion holds `lock` (the fast loop's: evolve/loop.py `EvolutionLoop.lock`), so
        # no two writers of the bank decide on the same library at once, scheduled runs included.
        self._lock = lock or asyncio.Lock()
        self._task: asyncio.Task | None = None
        self.last: dict[str, Any] | None = None
        self.counts = {"evidence_rows": 0, "runs": 0, "published": 0, "rejected": 0, "errors": 0, "yielded": 0}

    def record(self, pairs: list[tuple[Turn, Sample]]) -> int:
        rows = [evidence_from(t, s, self.bank.names(), self.markers) for t, s in pairs if t.turn_type == TurnType.main]
        n = self.store.append(rows) if rows else 0
        self.counts["evidence_rows"] += n
        return n

    def start(self) -> None:
        """Start the schedule (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._schedule())

    async def _schedule(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.interval_s)
            try:
                if self.cfg.only_when_idle and not await self._idle():
                    log.info("collective job: serving is not idle (no OMLS idle signal open); next try in %.0f s",
                             self.cfg.interval_s)
                    continue
                await self.run(scheduled=True)
            except GateYielded as e:
                log.info("collective job: %s", e)
            except Exception as e:  # noqa: BLE001 - the schedule must outlive one bad run
                log.warning("collective job failed: %s", e)

    async def _idle(self) -> bool:
        if self.omls is None:
            return False
        try:
            state = await asyncio.wait_for(names.actor(*self.omls, timeout_s=0).state.remote(), 10.0)
        except Exception as e:  # noqa: BLE001 - no OMLS: not known to be idle
            log.info("collective job: OMLS state unavailable (%s)", e)
            return False
        return bool(state.get("open_signals"))

    def _job(self) -> CollectiveJob:
        if self.job is None:
            raise RuntimeError("the validation gate is on but the Evolver was started without the engine and "
                               "PRM names to run it (start it through the composition root, cluster/system.py)")
        return self.job

    async def run(self, scheduled: bool = False) -> dict[str, Any]:
        """One job run, exclusive with other runs, promotions and fast-loop evolutions. A `scheduled` run
        with `only_when_idle` validates only while serving stays idle (raises `GateYielded` when it is not)."""
        job = self._job()
        still_idle = self._idle if scheduled and self.cfg.only_when_idle else None
        async with self._lock:
            try:
                report = await job.run(still_idle)
            except GateYielded as e:
                self.counts["yielded"] += 1
                self.last = {"yielded": str(e)}
                raise
            except GateUnavailable as e:
                self.counts["errors"] += 1
                self.last = {"error": str(e)}
                raise
        self._count(report)
        return report.as_dict()

    async def promote(self, name: str, scope: str) -> dict[str, Any]:
        """`CollectiveJob.promote`, exclusive like `run`."""
        job = self._job()
        async with self._lock:
            return await job.promote(name, scope)

    async def impact(self, sessions: list[str], published_from: dict[str, int]) -> dict[str, Any]:
        """The tasks of `sessions` replayed with a collective run's publishes (`published_from`: name -> its
        version before the run, 0 = created) as served and undone (evolve/impact.py)."""
        from evolve.impact import measure

        job = self._job()
        if job.validator is None:
            raise RuntimeError("measuring the impact replays through the gate's engine and PRM; the gate is off")
        self.bank.reload()
        undone = {n: (self.bank.text_at(n, v) if v else None) for n, v in published_from.items()}
        rows = self.store.of_sessions(sessions)
        result = await measure(job.validator, rows, self.bank.state_at, undone, self.cfg.gate.max_tasks * 8)
        return result.as_dict()

    def _count(self, report: JobReport) -> None:
        self.counts["runs"] += 1
        self.counts["published"] += len(report.published)
        self.counts["rejected"] += len(report.rejected)
        self.last = report.as_dict()

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "last": self.last}
