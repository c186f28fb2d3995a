"""One GRPO optimisation step on a model, independent of Ray (the worker loop and the benchmark share it).

Phases: advantages over the WHOLE leased batch -> this worker's shard -> `grad_accum` micro-batches ->
forward (logits only for response columns) -> per-token logprobs (trl's memory-light
`selective_log_softmax`) -> loss (train.algos) -> backward -> optimizer step through a `Backend`.

Data parallelism: every worker holds the full batch, so it knows the global masked-token count N.
Each micro-batch loss is (sum of its token losses) * world / N; DDP (and DeepSpeed) average gradients
over workers, so the update equals the gradient of the global token mean, however the batch is split
(tests/unit/test_train_algos.py checks the identity).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from trl.trainer.utils import selective_log_softmax

from core.config import TrainConfig
from core.contracts import Sample
from train import algos
from train.batch import Batch, chunk_indices, collate


class Backend(Protocol):
    """How gradients are taken and applied (plain/DDP torch optimizer, or a DeepSpeed engine)."""

    model: torch.nn.Module  # the module to call for forward (DDP- or engine-wrapped)

    def autocast(self) -> contextlib.AbstractContextManager: ...
    def no_sync(self, last_micro: bool) -> contextlib.AbstractContextManager: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> float: ...  # returns the gradient norm before clipping


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The peft model inside DDP (`.module`) or a DeepSpeed engine (`.module`)."""
    return getattr(model, "module", model)


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Learner logprobs of the sampled response tokens, (B, R) float32.

    Only the last R positions go through the LM head (`logits_to_keep`), so memory is O(B * R * V),
    not O(B * L * V); logits are upcast to fp32 so ratios against the engine's fp32 logprobs are exact.
    """
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.response_len,
        use_cache=False,
    )
    return selective_log_softmax(out.logits.float(), batch.targets)


def micro_loss(
    backend: Backend, batch: Batch, cfg: TrainConfig, denom: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch (already scaled by `denom`), plus detached sums for the step metrics."""
    with backend.autocast():
        logp = token_logprobs(backend.model, batch)
        ref = None
        if cfg.kl_coef > 0:
            # With LoRA the base model is the same network with the adapter switched off: no second copy.
            with torch.no_grad(), unwrap(backend.model).disable_adapter():
                ref = token_logprobs(unwrap(backend.model), batch)
    return algos.policy_loss(
        cfg.loss, logp, batch.old_logprobs, batch.advantages, batch.mask,
        clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef,
        ref_logp=ref, denom=denom,
    )


def shard_micro_batches(
    samples: Sequence[Sample], advantages: torch.Tensor, rank: int, world: int, grad_accum: int
) -> list[Batch]:
    """This worker's `grad_accum` micro-batches: a strided shard of the batch, sorted by length to cut
    padding. A worker with too few samples gets zero-weight micro-batches (a real forward/backward with
    an all-zero mask), because every worker must run the same number of backward passes for the
    gradient all-reduce."""
    mine = sorted(range(rank, len(samples), world), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
    batches = []
    for chunk in chunk_indices(len(mine), grad_accum):
        idx = [mine[j] for j in chunk]
        if idx:
            batches.append(collate([samples[i] for i in idx], advantages[idx]))
        else:
            filler = collate([samples[0]], torch.zeros(1))
            filler.mask.zero_()
            filler.sample_ids = []
            filler.num_tokens = 0
            batches.append(filler)
    return batches


def train_step(
    backend: Backend,
    samples: Sequence[Sample],
    cfg: TrainConfig,
    *,
    rank: int = 0,
    world: int = 1,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """One optimizer step on `samples` (the full leased batch, identical on every worker).

    Returns step metrics, summed over all workers (a collective: every worker must call it).
    """
    t0 = time.perf_counter()
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    advantages = algos.compute_advantages(rewards, [s.group_id for s in samples])
    # Same count as the collated masks (train.batch masks tokens whose engine logprob is not finite).
    total_tokens = float(sum(m for s in samples for m, lp in zip(s.loss_mask, s.response_logprobs, strict=True)
                             if math.isfinite(lp)))
    denom = max(total_tokens, 1.0) / world
    micro = shard_micro_batches(samples, advantages, rank, world, cfg.grad_accum)
    sums: dict[str, float] = {}
    loss_total = 0.0  # NOTE: .item() per micro-batch syncs; negligible next to a forward/backward
    for k, batch in enumerate(micro):
        batch = batch.to(device)
        with backend.no_sync(last_micro=k == len(micro) - 1):
            loss, stats = micro_loss(backend, batch, cfg, denom)
            backend.backward(loss)
        loss_total += loss.item()
        for key, v in stats.items():
            sums[key] = sums.get(key, 0.0) + float(v)
    grad_norm = backend.step()
    g = _global_sums([loss_total, sums.get("ratio_sum", 0.0), sums.get("clipped_tokens", 0.0),
                      sums.get("kl_sum", 0.0), sums.get("tokens", 0.0), float(sum(b.num_tokens for b in micro))],
                     world, device)
    tokens = max(g[4], 1.0)
    return {
        "loss": g[0] / world,  # each worker's part is scaled by world / N (see module doc)
        "grad_norm": grad_norm,
        "reward_mean": rewards.mean().item(),
        "adv_abs_mean": advantages.abs().mean().item(),
        "ratio_mean": g[1] / tokens,
        "clip_frac": g[2] / tokens,
        "kl": g[3] / tokens,
        "tokens_trained": g[4],  # masked (trained) response tokens
        "tokens_seq": g[5],  # prompt + response tokens through the model
        "step_s": time.perf_counter() - t0,
    }


def _global_sums(values: list[float], world: int, device: torch.device | str) -> list[float]:
    """Sum scalar metrics over data-parallel workers, so every step metric is global, not rank 0's."""
    if world == 1 or not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
