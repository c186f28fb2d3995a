"""Re-sampled GRPO groups for a training window (DESIGN.md "GRPO"; MetaClaw's window re-rollouts).

Users are served one response per prompt, so the replay buffer mostly holds loose samples, trained with
batch-normalised advantages. During a window the serving engine is otherwise idle, so before the run
trains, `run_rollouts` takes up to `max_prompts` fresh query prompts (`Replay.rollout_candidates`: the
current generation's, newest first, one per distinct prompt, none already re-sampled), asks the engine
for `group_size` responses to each EXACT prompt as it was served (its token ids: the current
generation's skills and memories as injected then; the active adapter), has the PRM grade every response
as the validation gate grades a replay (the prompt's check on the reply alone, else the judge without a
next state) and store the group whole (`PRM.score_group`). The step then leases the group whole and
trains it with group-relative advantages `(r - mean_g) / (std_g + eps)`.

Support/query separation holds as for any sample: a member carries the source's skill generation, so
an evolution before the step retires it with its source. A group is stored once (its id is "ro-" + the
source's sample id; its members' ids follow from it, and sinks ignore a re-sent id), so a window retried
after a crash re-samples nothing twice.

The engine, PRM and Replay are injected as callables (the composition root, cluster/controller.py,
wires their handles), so this module needs no Ray and is unit-tested with fakes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import RolloutConfig
from core.contracts import Sample, Turn
from train.replay_store import ROLLOUT_PREFIX

log = logging.getLogger(__name__)

Candidates = Callable[[int], Awaitable[list[Sample]]]
Complete = Callable[[dict[str, Any]], Awaitable[Any]]  # -> serve.protocol.Reply (its `capture`)
ScoreGroup = Callable[[list[Turn], str, bool], Awaitable[dict[str, Any]]]


@dataclass
class RolloutReport:
    prompts: int = 0  # fresh prompts re-sampled
    groups: int = 0  # groups stored
    samples: int = 0  # members stored
    uniform: int = 0  # groups dropped: every member got the same reward (no advantage)
    ungradable: int = 0  # groups dropped: a member nothing could grade (a check that reads files)
    failed: int = 0  # prompts the engine or the PRM could not answer now
    seconds: float = 0.0
    rewards: list[list[float]] = field(default_factory=list)  # per stored group

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_id_for(source: Sample) -> str:
    return ROLLOUT_PREFIX + source.sample_id


def completion_body(source: Sample, cfg: RolloutConfig, *, model: str, max_model_len: int,
                    seed: int) -> dict[str, Any] | None:
    """The engine request for `source`'s group (None: its prompt leaves no room for a response)."""
    room = max_model_len - len(source.prompt_ids)
    if room < 1:
        return None
    return {"model": model, "prompt": list(source.prompt_ids), "n": cfg.group_size,
            "temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": min(cfg.max_tokens, room),
            # One seed per (turn, run seed): a retried window draws the same group, and so does every run
            # that replays the same sessions (`clawray bench`'s paired runs). Not the sample id: a uuid4.
            "seed": (seed * 1_000_003 + zlib.crc32(f"{source.session_id}/{source.turn_index}".encode())) % (2**31)}


def group_turns(source: Sample, capture: Any, group_size: int) -> list[Turn]:
    """One Turn per response of the group, as the PRM scores turns; raises ValueError when the engine did
    not answer the exact prompt or not `group_size` responses (the group would be trained wrongly)."""
    if list(capture.prompt_ids) != list(source.prompt_ids):
        raise ValueError(f"the engine rendered another prompt for {source.sample_id}")
    if len(capture.choices) != group_size:
        raise ValueError(f"{len(capture.choices)} responses for {source.sample_id}, asked {group_size}")
    gid = group_id_for(source)
    return [
        Turn(turn_id=f"{gid}-{i}", session_id=source.session_id, turn_index=source.turn_index,
             tenant=source.tenant, prompt_ids=list(source.prompt_ids), response_ids=list(c.token_ids),
             response_logprobs=list(c.logprobs), response_text=c.text, finish_reason=c.finish_reason,
             sampling=capture.sampling, skills=list(source.skills), memories=list(source.memories),
             skill_generation=source.skill_generation, adapter_version=capture.adapter, group_id=gid,
             group_size=group_size, eval_spec=source.eval_spec, last_in_session=True)
        for i, c in sorted(capture.choices.items())
    ]


async def run_rollouts(cfg: RolloutConfig, candidates: Candidates, complete: Complete, score_group: ScoreGroup,
                       *, model: str, max_model_len: int, seed: int = 0, concurrency: int = 2) -> RolloutReport:
    """Re-sample, grade and store the groups of one run (module docstring). Never raises for one prompt:
    an engine or PRM failure counts in `failed` (its prompt stays fresh for a later window)."""
    t0, report = time.monotonic(), RolloutReport()
    if not cfg.enabled:
        return report
    sources = await candidates(cfg.max_prompts)
    sem = asyncio.Semaphore(concurrency)

    async def one(source: Sample) -> None:
        body = completion_body(source, cfg, model=model, max_model_len=max_model_len, seed=seed)
        if body is None:
            return
        report.prompts += 1
        try:
            async with sem:
                reply = await asyncio.wait_for(complete(body), cfg.timeout_s)
            turns = group_turns(source, reply.capture, cfg.group_size)
            out = await asyncio.wait_for(score_group(turns, source.sample_id, cfg.keep_uniform_groups),
                                         cfg.timeout_s)
        except Exception as e:  # noqa: BLE001 - one prompt's failure must not cost the window its run
            report.failed += 1
            log.warning("re-sampling %s failed: %s: %s", source.sample_id, type(e).__name__, str(e)[:200])
            return
        if out["why"] == "stored":
            report.groups += 1
            report.samples += int(out["stored"])
            report.rewards.append([float(r) for r in out["rewards"]])
        elif out["why"] == "uniform":
            report.uniform += 1
        else:
            report.ungradable += 1

    await asyncio.gather(*(one(s) for s in sources))
    report.seconds = round(time.monotonic() - t0, 3)
    return report
