"""`PRM`: the process-reward-model Ray actor (async; pool members are named `PRM-0`, `PRM-1`, ...).

A thin actor around `Scorer`: score a turn, append the sample to the replay sink, tell the evolver.

Contract with the caller (the serving plane's durable turn outbox):
- `await prm.score.remote(turn)` returns the stored Sample (or None for a side turn) only AFTER the
  sample is durable in the sink. The outbox may then drop the turn.
- It raises a `ScoringError` subclass with `retryable = True` (JudgeUnavailable, TeacherUnavailable,
  SinkUnavailable) when the judge, the teacher or the sink failed: NOTHING was stored, and the outbox
  must keep the turn and send it again later (e.g. after `rewards.retry_interval_s`). A dead or slow
  judge therefore delays scoring but never loses a turn and never blocks serving.
- A turn sent twice is stored once (`sample_id == turn_id`, sinks ignore duplicates), and the evolver is
  told after EVERY successful store, re-deliveries included: a crash between the store and the notice
  must not lose the notice. The Evolver ignores a sample id it has already observed, so a failure is
  never counted twice (evolve/loop.py).
- ConfigError (not retryable) when the OPD teacher's tokenizer differs from the policy's.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import names
from core.agent_context import AGENT_CONTEXT_MARKERS
from core.config import RewardsConfig
from core.contracts import Sample, Turn
from rewards.errors import ScoringError, SinkUnavailable
from rewards.scorer import DEFAULT_JUDGE_MAX_TOKENS, Scorer
from rewards.sinks import SampleSink

log = logging.getLogger(__name__)

EVOLVER_LOOKUP_EVERY_S = 5.0  # how often an absent Evolver is looked up again


class EvolverNotifier:
    """Fire-and-forget `<name>.observe.remote(turn, sample)` (the Evolver, the Memory actor); never fails
    the caller."""

    def __init__(self, name: str = names.EVOLVER, namespace: str = names.DEFAULT_NAMESPACE):
        self.name = name
        self.namespace = namespace
        self._next_lookup = 0.0

    def notify(self, turn: Turn, sample: Sample) -> bool:
        handle = names.cached(self.name, self.namespace)
        if handle is None:
            if time.monotonic() < self._next_lookup:
                return False
            try:
                handle = names.actor(self.name, self.namespace, timeout_s=0)
            except ValueError:  # no Evolver running: skills-only evolution is optional
                self._next_lookup = time.monotonic() + EVOLVER_LOOKUP_EVERY_S
                return False
        try:
            handle.observe.remote(turn, sample)  # result deliberately not awaited
            return True
        except Exception as e:  # noqa: BLE001 - a dead/odd Evolver handle must never fail scoring
            log.warning("%s notify failed (%s); looking it up again later", self.name, type(e).__name__)
            names.forget(self.name, self.namespace)
            return False


class PRM:
    """Ray actor class (see module docstring for the contract).

    Args:
        cfg: the rewards section.
        sink_factory: called once inside the actor to build the sink (e.g. `ReplayActorSink`, or
            `functools.partial(LocalSampleSink, path)`): sinks hold connections that do not pickle.
        tokenizer_path: the policy's tokenizer folder (judge token budget; OPD tokenizer check).
        workspace_root: where `file_check`-style checkers find the workspace files.
        evolver_name: the named actor told about each scored turn.
        observer_names: more named actors told the same way (`observe(turn, sample)`, fire-and-forget),
            e.g. the `Memory` actor; the composition root names them.
        namespace: the Ray namespace those actors live in (`ray.namespace`).
    """

    def __init__(
        self,
        cfg: RewardsConfig,
        sink_factory: Callable[[], SampleSink],
        *,
        tokenizer_path: str | None = None,
        workspace_root: str | Path | None = None,
        evolver_name: str = names.EVOLVER,
        observer_names: tuple[str, ...] = (),
        namespace: str = names.DEFAULT_NAMESPACE,
        judge_max_tokens: int = DEFAULT_JUDGE_MAX_TOKENS,
        engine_judge: dict[str, str] | None = None,
        agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS,
    ):
        self.scorer = Scorer.from_config(
            cfg, tokenizer_path=tokenizer_path, workspace_root=workspace_root, judge_max_tokens=judge_max_tokens,
            engine_judge=engine_judge, agent_markers=agent_markers,
        )
        self.sink = sink_factory()
        self.evolver = EvolverNotifier(evolver_name, namespace)
        self.observers = [EvolverNotifier(name, namespace) for name in observer_names]
        self.counts: Counter[str] = Counter()

    async def ready(self) -> dict[str, Any]:
        """Check what can be checked before traffic (the OPD teacher's tokenizer); the status."""
        await self.scorer.check_teacher()
        return await self.status()

    async def score(self, turn: Turn) -> Sample | None:
        """Score `turn`, store the sample durably, notify the evolver; see the module contract."""
        try:
            sample = await self.scorer.score(turn)
            if sample is None:
                self.counts["side"] += 1
                return None
            try:
                await self.sink.append([sample])
            except SinkUnavailable:
                raise
            except Exception as e:  # noqa: BLE001 - any sink failure must read as retryable to the outbox
                raise SinkUnavailable(f"sink {type(self.sink).__name__} failed: {type(e).__name__}: {e}") from e
        except ScoringError as e:
            self.counts[f"error:{type(e).__name__}"] += 1
            raise
        self.counts["scored"] += 1
        self.counts["trainable"] += int(sample.trainable)
        self.evolver.notify(turn, sample)
        for observer in self.observers:
            observer.notify(turn, sample)
        return sample

    async def score_group(self, turns: list[Turn], source_id: str, keep_uniform: bool = False) -> dict[str, Any]:
        """Score a re-sampled GRPO group (train/rollouts.py: every member answers one prompt) and store it
        whole, in one append, or not at all: a member nothing can grade leaves the group ungradable, and
        a group whose rewards are all equal (no advantage) is dropped unless `keep_uniform`. Users' turns
        are not involved: the evolver and observers are not told. `source_id`: the sample whose prompt the
        group answers (`Sample.rollout_of`). Returns {"stored", "rewards", "why"}."""
        samples = [await self.scorer.score_rollout(t) for t in turns]
        if any(s is None for s in samples) or not samples:
            self.counts["rollout_ungradable"] += 1
            return {"stored": 0, "rewards": [], "why": "ungradable"}
        for s in samples:
            s.rollout_of = source_id
        rewards = [s.reward for s in samples]
        if not keep_uniform and max(rewards) == min(rewards):
            self.counts["rollout_uniform"] += 1
            return {"stored": 0, "rewards": rewards, "why": "uniform"}
        try:
            await self.sink.append(samples)
        except Exception as e:  # noqa: BLE001 - the caller retries a later window; nothing half-stored
            raise SinkUnavailable(f"sink {type(self.sink).__name__} failed: {type(e).__name__}: {e}") from e
        self.counts["rollout_samples"] += len(samples)
        return {"stored": len(samples), "rewards": rewards, "why": "stored"}

    async def grade(self, messages: list[dict[str, Any]], reply: str, eval_spec: dict[str, Any] | None,
                    files: dict[str, bytes] | None = None) -> float | None:
        """Grade a replayed reply (and the files a replay with tools left) in [0, 1] with this PRM's
        checkers/judge (the validation gate's A/B; nothing is stored): `Scorer.grade`."""
        return await self.scorer.grade(messages, reply, eval_spec, files)

    async def status(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "usage": self.scorer.usage()}
