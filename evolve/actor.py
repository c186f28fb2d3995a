"""`Evolver`: the named Ray actor of the fast loop (thin wrapper around `EvolutionLoop`).

Name `Evolver`, in the configured namespace (`ray.namespace`; names: core/names.py). The PRM (or whoever scores turns) calls `observe(turn, sample)`
for every scored main turn; the actor buffers, triggers evolutions, writes the SkillBank, and tells the
`Replay` actor (if there is one) which samples were the support set and the new skill generation.
It is an async actor, so `stats()` and further `observe` calls are served while an LLM evolver waits.
Each evolution runs inside a replay fence (evolve/loop.py); the bank's generation never goes back
(a wiped skills folder is reconciled at start-up, against Replay's generation, and at the next turn).

With an object-storage root (`blob_root`) the skills folder is this host's scratch and the library lives
in the bucket (evolve/mirror.py): the actor pulls the newest snapshot before its bank loads (restarted on
another host, it continues the library with the same generation) and publishes one after every committed
change, off its event loop. A publish that fails (bucket unreachable) leaves the change local; it goes
out after the next turn. One that had to merge another writer's version announces the merged generation.

Metrics (`ray.util.metrics`, Prometheus via the Ray metrics agent; docs/metrics.md): counters
`clawray_evolutions_triggered_total`, `clawray_evolutions_accepted_total`,
`clawray_evolutions_rejected_total`, `clawray_skills_accepted_total`, `clawray_skills_rejected_total`
(each exported at 0 from the start); gauges `clawray_skills`, `clawray_skill_generation`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import ray
from ray.util.metrics import Counter, Gauge

from core import names
from core.agent_context import AGENT_CONTEXT_MARKERS
from core.config import EvolverConfig, SkillsConfig
from core.contracts import Sample, Turn
from core.metrics import hold, zero_counter
from evolve.bank import SkillBank
from evolve.embedding import SentenceEmbedder
from evolve.evolvers import make_evolver
from evolve.loop import EvolutionLoop, EvolutionReport
from evolve.mirror import Published, SkillMirror

log = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 10.0


class RayReplayLink:
    """The evolution fence on the `Replay` actor (evolve/loop.py). No Replay actor (skills-only
    deployments, tests): every failure may be evolved from. A failing one: nothing is claimed, so the
    evolution uses no failure (it could not keep them out of training); logged and counted."""

    def __init__(self, name: str = names.REPLAY, namespace: str = names.DEFAULT_NAMESPACE):
        self.name, self.namespace = name, namespace
        self.errors = 0

    def _handle(self, method: str):
        try:  # cached; one try: a missing Replay is not waited for
            return names.actor(self.name, self.namespace, timeout_s=0)
        except ValueError:
            log.info("no %s actor; %s skipped", self.name, method)
            return None

    def _failed(self) -> None:
        """A call failed: counted, and the handle looked up again next time (the actor may be a new one)."""
        self.errors += 1
        names.forget(self.name, self.namespace)

    async def _call(self, method: str, *args: Any) -> tuple[bool, Any]:
        """(reached, result): reached is False when there is no Replay actor; raises RayError/TimeoutError."""
        handle = self._handle(method)
        if handle is None:
            return False, None
        return True, await asyncio.wait_for(getattr(handle, method).remote(*args), timeout=REPLAY_TIMEOUT_S)

    async def begin_evolution(self, sample_ids: list[str], ttl_s: float) -> tuple[str | None, list[str]]:
        try:
            reached, out = await self._call("begin_evolution", list(sample_ids), float(ttl_s))
        except (ray.exceptions.RayError, TimeoutError) as e:
            self._failed()
            log.warning("%s.begin_evolution failed: %s; the evolution claims no failure", self.name, e)
            return None, []
        return (out[0], list(out[1])) if reached else (None, list(sample_ids))

    async def end_evolution(self, token: str | None, generation: int | None, release_ids: list[str]) -> None:
        if token is None and generation is None:
            return
        try:
            if token is None:  # no fence was opened (no Replay then): still announce the generation
                await self._call("set_generation", int(generation))
            else:
                await self._call("end_evolution", token, generation, list(release_ids))
        except (ray.exceptions.RayError, TimeoutError) as e:
            # The fence expires on its own; samples of the new generation advance Replay when they arrive.
            self._failed()
            log.warning("%s.end_evolution failed: %s", self.name, e)

    def generation(self) -> int:
        """Replay's current generation (0 without a Replay actor); blocking, for start-up only."""
        handle = self._handle("generation")
        if handle is None:
            return 0
        try:
            return int(ray.get(handle.stats.remote(), timeout=REPLAY_TIMEOUT_S)["generation"])
        except (ray.exceptions.RayError, TimeoutError) as e:
            self._failed()
            log.warning("%s.stats failed: %s", self.name, e)
            return 0


@ray.remote(num_cpus=0.1, max_restarts=-1)
class Evolver:
    """Args: skills_root (the storage root's skills/ folder), the two config sections, whether to load
    the embedding model for near-duplicate refusal (default: when retrieval is `embedding`), the name of
    the replay actor to notify, the object-storage root the library is mirrored to (None: local), and
    the Ray namespace of the replay actor (`ray.namespace`)."""

    def __init__(self, skills_root: str, skills_cfg: SkillsConfig, evolver_cfg: EvolverConfig,
                 dedup_embeddings: bool | None = None, replay_name: str = names.REPLAY,
                 blob_root: str | None = None, namespace: str = names.DEFAULT_NAMESPACE,
                 collective: dict[str, Any] | None = None, agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS):
        logging.basicConfig(level=logging.INFO)
        use_emb = skills_cfg.retrieval == "embedding" if dedup_embeddings is None else dedup_embeddings
        embedder = (SentenceEmbedder(skills_cfg.embedding_model, encoder=skills_cfg.embedding_encoder)
                    if use_emb else None)
        self._mirror = SkillMirror(blob_root, Path(skills_root)) if blob_root else None
        if self._mirror is not None:
            self._mirror.pull()  # before the bank loads: the library continues from the bucket
        self._bank = SkillBank(Path(skills_root), skills_cfg, embedder)
        self._publishing = asyncio.Lock()  # one publish at a time; each sees the previous one's version
        self._publish_errors = 0
        self._replay = RayReplayLink(replay_name, namespace)
        self._loop = EvolutionLoop(self._bank, evolver_cfg, make_evolver(evolver_cfg), self._replay,
                                   markers=agent_markers)
        # Collective evolution (evolve/collective_runner.py): `collective` is what the composition root
        # wires: {"storage_root", "state", "gate": {engine, prms, namespace} | None, "omls": [name, ns]}.
        self._collective = None
        if collective is not None and evolver_cfg.collective.enabled:
            from evolve.collective_runner import CollectiveRunner

            omls = tuple(collective["omls"]) if collective.get("omls") else None
            self._collective = CollectiveRunner(self._bank, evolver_cfg.collective, collective["storage_root"],
                                                collective.get("state"), self._replay, collective.get("gate"), omls,
                                                evolver_cfg.llm, self._loop.lock,
                                                sync=self._publish if self._mirror is not None else None,
                                                markers=agent_markers)
        # Each at 0 from the start: a first rejection must show as an increase (core/metrics.py).
        self._counters = {k: zero_counter(c) for k, c in {
            "evolutions_triggered": Counter("clawray_evolutions_triggered_total", "Evolutions started."),
            "evolutions_accepted": Counter("clawray_evolutions_accepted_total",
                                           "Evolutions whose skills the bank took (written or merged)."),
            "evolutions_rejected": Counter("clawray_evolutions_rejected_total",
                                           "Evolutions that added nothing: no claimable failure, an evolver error "
                                           "or timeout, no skill, or every skill refused."),
            "skills_accepted": Counter("clawray_skills_accepted_total", "Skills written with new content."),
            "skills_rejected": Counter("clawray_skills_rejected_total", "Skills the bank refused."),
        }.items()}
        self._gauges = {"skills": Gauge("clawray_skills", "Skills in the library."),
                        "generation": Gauge("clawray_skill_generation", "The library's skill generation.")}
        self._exported = {k: 0 for k in self._counters}
        self._loop.reconcile(self._replay.generation())  # e.g. restarted after the skills folder was wiped
        self._publish_now()
        self._export()

    async def observe(self, turn: Turn, sample: Sample) -> dict[str, Any] | None:
        """Buffer one scored turn; returns the evolution report when it triggered one."""
        self._loop.reconcile()  # cheap (a few stats): a wiped folder is healed at the next turn
        report = await self._loop.observe(turn, sample)
        self._record([(turn, sample)])
        await self._publish()
        return self._done(report)

    async def observe_many(self, pairs: list[tuple[Turn, Sample]]) -> list[dict[str, Any]]:
        """`observe` for several turns in order; returns the reports of the evolutions triggered."""
        self._loop.reconcile()
        reports = [await self._loop.observe(t, s) for t, s in pairs]
        self._record(pairs)
        await self._publish()
        return [r for r in (self._done(x) for x in reports) if r is not None]

    async def evolve_now(self, session_id: str | None = None) -> dict[str, Any] | None:
        """Evolve from the buffered failures of `session_id` (or all sessions) now."""
        report = await self._loop.evolve_now(session_id)
        await self._publish()
        return self._done(report)

    def _record(self, pairs: list[tuple[Turn, Sample]]) -> None:
        """Evidence rows for collective evolution; a failure there never fails the fast loop."""
        if self._collective is None:
            return
        try:
            self._collective.record(pairs)
        except Exception as e:  # noqa: BLE001 - e.g. the state database unreachable: logged, counted
            self._collective.counts["errors"] += 1
            log.warning("recording collective-evolution evidence failed: %s", e)

    async def start_collective(self) -> bool:
        """Start the collective job's schedule (idempotent); False when collective evolution is off."""
        if self._collective is None:
            return False
        self._collective.start()
        return True

    async def collective_run(self) -> dict[str, Any]:
        """One collective job run now (`clawray skills evolve --now`), exclusive with fast-loop evolutions."""
        if self._collective is None:
            raise RuntimeError("collective evolution is off (evolver.collective.enabled) or not wired")
        out = await self._collective.run()
        await self._publish()
        self._export()
        return out

    async def collective_impact(self, sessions: list[str], published_from: dict[str, int]) -> dict[str, Any]:
        """The tasks of `sessions` with a collective run's publishes as served vs undone (evolve/impact.py)."""
        if self._collective is None:
            raise RuntimeError("collective evolution is off (evolver.collective.enabled) or not wired")
        return await self._collective.impact(sessions, published_from)

    async def collective_promote(self, name: str, scope: str) -> dict[str, Any]:
        """Widen skill `name`'s scope through the validation gate (`clawray skills promote`)."""
        if self._collective is None:
            raise RuntimeError("collective evolution is off (evolver.collective.enabled) or not wired")
        out = await self._collective.promote(name, scope)
        await self._publish()
        self._export()
        return out

    def collective_stats(self) -> dict[str, Any] | None:
        return None if self._collective is None else self._collective.stats()

    def collective_decisions(self, limit: int = 50) -> list[dict[str, Any]]:
        return [] if self._collective is None else self._collective.store.decisions(limit)

    def stats(self) -> dict[str, Any]:
        return {**self._loop.stats(), "replay_errors": self._replay.errors,
                "skills_version": self._mirror.version if self._mirror is not None else None,
                "publish_errors": self._publish_errors}

    def pending(self) -> dict[str, int]:
        """Buffered failed turns per session (what `evolve_now(session_id)` would evolve from)."""
        return self._loop.pending()

    def generation(self) -> int:
        return self._bank.generation

    def reconcile_generation(self, floor: int = 0) -> int:
        """Write a new generation when the skills folder went back (below one seen, or below `floor`:
        Replay's generation at system start). Returns the bank's generation."""
        self._loop.reconcile(floor)
        if self._publish_now() is not None:
            self._bank.reload()  # a merge with another writer's version moved the generation past both
        self._export()
        return self._bank.generation

    def _publish_now(self) -> Published | None:
        """Publish a committed change before returning (start-up: a failure there is the caller's)."""
        if self._mirror is None or not self._mirror.changed():
            return None
        return self._mirror.publish()

    async def _publish(self) -> list[str]:
        """Publish a committed change to the bucket, in a thread (the bank's lock file keeps the staged
        copy whole); Proxy replicas on every host follow it. Returns the skills whose change here lost to a
        change another host published first (evolve/mirror.py `Published.lost`): the collective job decides
        those again; a fast-loop lesson among them stays in the history only (its failures teach again)."""
        if self._mirror is None or not self._mirror.changed():
            return []
        async with self._publishing:
            try:
                out = await asyncio.to_thread(self._mirror.publish)
            except Exception as e:  # noqa: BLE001 - bucket unreachable or slow: the change stays local and
                self._publish_errors += 1  # goes out after the next turn (`changed()` still says so)
                log.warning("publishing the skill library failed (retried after the next turn): %s", e)
                return []
            lost = list(out.lost if out is not None else self._mirror.lost_since_publish)
        if lost:
            self._bank.reload()
            log.warning("skills %s: another host published a change first; kept its version", lost)
        if out is not None and out.merged:  # the merged library has a generation no evolution announced
            await self._replay.end_evolution(None, int(out.record["generation"]), [])
        return lost

    def _done(self, report: EvolutionReport | None) -> dict[str, Any] | None:
        self._export()
        return report.as_dict() if report is not None else None

    def _export(self) -> None:
        counters = self._loop.counters
        for key, metric in self._counters.items():
            delta = counters[key] - self._exported[key]
            if delta > 0:
                metric.inc(delta)
                self._exported[key] = counters[key]
        hold(self._gauges["skills"], len(self._bank))  # held: set again while no turn comes
        hold(self._gauges["generation"], self._bank.generation)


def get_or_create_evolver(skills_root: Path, skills_cfg: SkillsConfig, evolver_cfg: EvolverConfig, *,
                          detached: bool = False, dedup_embeddings: bool | None = None,
                          name: str = names.EVOLVER, replay_name: str = names.REPLAY, blob_root: str | None = None,
                          namespace: str = names.DEFAULT_NAMESPACE, collective: dict[str, Any] | None = None,
                          agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS):
    """The `Evolver` actor handle, created if it does not exist yet (the composition root calls this).
    `blob_root`: the object-storage root the library is mirrored to (`ClawrayConfig.blob_root()`);
    `namespace`: the Ray namespace of it and of the replay actor (`ray.namespace`)."""
    opts: dict[str, Any] = {"name": name, "namespace": namespace, "get_if_exists": True}
    if detached:
        opts["lifetime"] = "detached"
    names.forget(name, namespace)  # a handle this process cached may be of a killed incarnation
    return Evolver.options(**opts).remote(str(skills_root), skills_cfg, evolver_cfg, dedup_embeddings,
                                          replay_name, blob_root, namespace, collective, agent_markers)

