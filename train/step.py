"""One GRPO optimisation step on a model, independent of Ray (the worker loop and the benchmark share it).

Phases: advantages over the WHOLE leased batch -> this worker's shard -> micro-batches (`grad_accum`
chunks, each at most `micro_batch_tokens` padded tokens) ->
forward (logits only for response columns) -> per-token logprobs under each row's sampling
distribution (`sampling_logprobs`: the engine's own processing, so the importance ratio compares like
with like; `gathered_logprobs`, memory-light: no (.., V) log-softmax copy) -> loss (train.algos) -> backward -> optimizer
step through a `Backend`.

Data parallelism: every worker holds the full batch, so it knows the global masked-token count N.
Each micro-batch loss is (sum of its token losses) * world / N; DDP (and DeepSpeed) average gradients
over workers, so the update equals the gradient of the global token mean, however the batch is split
(tests/unit/test_train_algos.py checks the identity).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

from core.config import TrainConfig
from core.contracts import Sample
from train import algos
from train.batch import Batch, collate, plan_micro_batches


class Backend(Protocol):
    """How gradients are taken and applied (plain/DDP torch optimizer, or a DeepSpeed engine)."""

    model: torch.nn.Module  # the module to call for forward (DDP- or engine-wrapped)
    fixed_micro_batches: bool  # it counts exactly `grad_accum` micro-batches itself (DeepSpeed)

    def autocast(self) -> contextlib.AbstractContextManager: ...
    def no_sync(self, last_micro: bool) -> contextlib.AbstractContextManager: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> float: ...  # returns the gradient norm before clipping
    def discard(self) -> None: ...  # drop the accumulated gradients without an update


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The peft model inside DDP (`.module`) or a DeepSpeed engine (`.module`)."""
    return getattr(model, "module", model)


GREEDY_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: below it a request is greedy, logprobs at temperature 1


def _top_k_top_p(x: torch.Tensor, k: int, p: torch.Tensor) -> torch.Tensor:
    """vLLM's `apply_top_k_top_p` for one row's (R, V) logits: keep the logits >= the k-th largest
    (ties kept), then drop the smallest-probability tokens whose cumulative probability stays <= 1 - p
    (the most likely token always stays). Dropped logits become -inf."""
    if 0 < k < x.shape[-1]:
        x = x.masked_fill(x < x.topk(k, dim=-1).values[..., -1:], -math.inf)
    if p < 1.0:
        srt, idx = x.sort(dim=-1, descending=False)
        drop = srt.softmax(dim=-1).cumsum(dim=-1) <= 1 - p
        drop[..., -1] = False
        x = torch.empty_like(x).scatter_(-1, idx, srt.masked_fill(drop, -math.inf))
    return x


def gathered_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`log_softmax(logits, -1).gather(-1, targets)` without materialising the log-softmax: the target's
    logit minus its row's logsumexp, one leading row at a time (peak memory of one row). Shapes (..., V) and
    (...) -> (...).

    On CUDA this is trl's `selective_log_softmax` (a fused Triton kernel where available). On CPU trl runs
    exactly the math below, and importing its module costs ~2.5 s of every training window's worker
    start-up (it pulls in transformers' Trainer, pandas, accelerate: benchmarks/window_efficiency.py), so the
    few lines are written here instead.
    """
    if logits.is_cuda:
        from trl.trainer.utils import selective_log_softmax

        return selective_log_softmax(logits, targets)
    idx = targets.unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, idx).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits]) if logits.ndim > 1 \
            else torch.logsumexp(logits, dim=-1)
        return picked - lse
    # Low precision: logsumexp then subtract loses too much; a log_softmax per leading row instead.
    if logits.ndim == 1:
        return torch.log_softmax(logits, -1).gather(-1, idx).squeeze(-1)
    return torch.stack([torch.log_softmax(row, -1).gather(-1, i).squeeze(-1)
                        for row, i in zip(logits, idx, strict=True)])


def sampling_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Logprobs of `targets` under the distribution each row was sampled from, in vLLM's order (its
    `Sampler` with `logprobs_mode=processed_logprobs`): logits / temperature (greedy rows: 1), top-k,
    top-p, log_softmax. A target outside its row's kept set gets -inf.

    Args: logits (B, R, V) float32; targets (B, R) long; temperature, top_p (B,) float32; top_k (B,) long.
    Returns: (B, R) float32.
    NOTE: vLLM's other logits processors (penalties, min_p, logit_bias, bad words) are not reproduced.
    """
    temps = torch.where(temperature < GREEDY_TEMPERATURE, torch.ones_like(temperature), temperature)
    plain = (temps == 1.0) & ((top_k <= 0) | (top_k >= logits.shape[-1])) & (top_p >= 1.0)
    if bool(plain.all()):
        return gathered_logprobs(logits, targets)  # memory-light: no (B, R, V) copies
    rows = []
    for i in range(logits.shape[0]):  # one row at a time: the top-p sort costs O(R * V), not O(B * R * V)
        x = logits[i] if plain[i] else _top_k_top_p(logits[i] / temps[i], int(top_k[i]), top_p[i])
        rows.append(gathered_logprobs(x, targets[i]))
    return torch.stack(rows)


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Learner logprobs of the sampled response tokens under each row's sampling distribution, (B, R) fp32.

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
    return sampling_logprobs(out.logits.float(), batch.targets, batch.temperature, batch.top_k, batch.top_p)


def _finite(mask: torch.Tensor, *logps: torch.Tensor | None) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Mask tokens whose learner (or reference) logprob is -inf and zero those logprobs.

    A sampled token can fall outside the learner's top-k/top-p set once the weights moved (and padding
    targets often do); its ratio is 0 and its gradient under IS/PPO is 0 anyway, but -inf would turn a
    CISPO loss or a KL term into inf/nan. Such a token is masked, like one without an engine logprob."""
    for lp in logps:
        if lp is not None:
            mask = mask * torch.isfinite(lp).to(mask.dtype)
    return mask, [None if lp is None else torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp))
                  for lp in logps]


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
    mask, (logp, ref) = _finite(batch.mask, logp, ref)
    advantages, rkl = batch.advantages, None
    if cfg.opd_weight > 0 and batch.teacher_logprobs is not None:
        advantages, rkl = algos.opd_advantages(advantages, batch.old_logprobs, batch.teacher_logprobs,
                                               batch.teacher_mask * mask, cfg.opd_weight)
    loss, stats = algos.policy_loss(
        cfg.loss, logp, batch.old_logprobs, advantages, mask,
        clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef,
        ref_logp=ref, denom=denom,
    )
    if rkl is not None:
        stats["opd_rkl_sum"] = rkl.detach().sum()
        stats["opd_tokens"] = (batch.teacher_mask * mask).sum()
    return loss, stats


def shard_micro_batches(
    samples: Sequence[Sample], advantages: torch.Tensor, rank: int, world: int, grad_accum: int,
    max_tokens: int | None = None,
) -> list[Batch]:
    """This worker's micro-batches: a strided shard of the batch, sorted by length to cut padding, in
    `grad_accum` chunks, each split further to at most `max_tokens` padded tokens (train/batch.py
    `plan_micro_batches`). Every worker must run the same number of backward passes for the gradient
    all-reduce, and every worker holds the whole batch, so each plans every shard and runs as many
    micro-batches as the largest plan: a worker with fewer gets zero-weight micro-batches (a real
    forward/backward with an all-zero mask)."""
    def shard(r: int) -> list[int]:
        return sorted(range(r, len(samples), world),
                      key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))

    def plan(idx: list[int]) -> list[list[int]]:
        shapes = [(len(samples[i].prompt_ids), len(samples[i].response_ids)) for i in idx]
        return [[idx[j] for j in chunk] for chunk in plan_micro_batches(shapes, grad_accum, max_tokens)]

    mine = plan(shard(rank))
    count = max(len(plan(shard(r))) for r in range(world)) if world > 1 else len(mine)
    batches = []
    for idx in mine + [[] for _ in range(count - len(mine))]:
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
    before_update: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """One optimizer step on `samples` (the full leased batch, identical on every worker).

    `before_update` runs once the gradients exist and before the optimizer applies them; it must
    return the same answer on every worker (the worker loop broadcasts rank 0's seal decision). False
    discards the gradients: no update, metrics with `discarded=True` (train/grpo.py's commit point).
    Returns step metrics, summed over all workers (a collective: every worker must call it).
    """
    t0 = time.perf_counter()
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    advantages = algos.compute_advantages(rewards, [s.group_id for s in samples])
    # Same count as the collated masks (train.batch masks tokens whose engine logprob is not finite).
    total_tokens = float(sum(m for s in samples for m, lp in zip(s.loss_mask, s.response_logprobs, strict=True)
                             if math.isfinite(lp)))
    denom = max(total_tokens, 1.0) / world
    budget = None if backend.fixed_micro_batches else cfg.micro_batch_tokens
    micro = shard_micro_batches(samples, advantages, rank, world, cfg.grad_accum, budget)
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
    discarded = before_update is not None and not before_update()
    if discarded:
        backend.discard()
    grad_norm = float("nan") if discarded else backend.step()
    g = _global_sums([loss_total, sums.get("ratio_sum", 0.0), sums.get("clipped_tokens", 0.0),
                      sums.get("kl_sum", 0.0), sums.get("tokens", 0.0), float(sum(b.num_tokens for b in micro)),
                      sums.get("opd_rkl_sum", 0.0), sums.get("opd_tokens", 0.0)],
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
        # OPD: mean reverse KL to the teacher over the tokens that had a teacher logprob (0: none/off)
        "opd_kl": g[6] / g[7] if g[7] else 0.0,
        "opd_tokens": g[7],
        "step_s": time.perf_counter() - t0,
        "discarded": discarded,
    }


def _global_sums(values: list[float], world: int, device: torch.device | str) -> list[float]:
    """Sum scalar metrics over data-parallel workers, so every step metric is global, not rank 0's."""
    if world == 1 or not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
