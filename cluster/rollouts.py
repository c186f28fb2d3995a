"""The Controller's re-sampling phase wired to the actors (train/rollouts.py holds the logic): the Replay
actor lists the fresh prompts, the engine deployment answers them (`PolicyEngine.complete`, token ids,
the active adapter), a PRM of the pool grades and stores each group (`PRM.score_group`)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from core.config import ClawrayConfig
from core.contracts import Turn
from train.rollouts import RolloutReport, run_rollouts


async def resample_groups(cfg: ClawrayConfig, *, replay: Any, engine: Any,
                          prm: Callable[[str], Any], prms: list[str]) -> RolloutReport:
    """One run's groups. `replay`: the Replay actor handle; `engine`: the engine deployment's handle;
    `prm(name)`: the PRM actor of that name (None when absent); `prms`: the pool's names (a group goes to
    one of them by its source's id, as turns go by session)."""

    async def candidates(n: int):
        return await replay.rollout_candidates.remote(n)

    async def complete(body: dict[str, Any]):
        return await engine.complete.remote(body)

    async def score_group(turns: list[Turn], source_id: str, keep_uniform: bool):
        handle = prm(prms[zlib.crc32(source_id.encode()) % len(prms)])
        if handle is None:
            raise RuntimeError("no PRM actor to grade the group")
        return await handle.score_group.remote(turns, source_id, keep_uniform)

    return await run_rollouts(cfg.train.rollouts, candidates, complete, score_group,
                              model=cfg.model.policy_alias, max_model_len=cfg.model.max_model_len,
                              seed=cfg.train.seed)
