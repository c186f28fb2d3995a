"""GRPO math as pure torch functions: advantages, token-level policy losses, KL to the base.

Every estimator and loss is registered by name; asking for an unknown name raises an error that lists
the valid ones. No Ray, no model code: inputs are tensors, outputs are tensors (verl's core_algos layout).

Shapes: B = samples in the (micro-)batch, R = padded response length. `mask` is the per-token loss mask
(1 = trained on, 0 = padding or masked token), float.

Loss conventions (DESIGN.md "GRPO"), all against the ENGINE's sampled logprobs `old_logp` (behaviour
policy q), `logp` = the learner's logprobs (p_theta) of the same tokens, ratio r = exp(logp - old_logp):

- `importance_sampling` (MetaClaw's default: MetaClaw sends its batches to tinker's built-in
  `importance_sampling` loss, documented there as `-(exp(target_lp - sampling_lp) * A)`). We keep that
  form: the ratio is NOT detached, so its gradient is r * A * grad(logp), i.e. exactly the "detached
  ratio weighting" sg(r) * A * grad(logp) of REINFORCE with an importance weight; the loss value equals
  -mean(A) when p == q, which the tests check.
- `ppo`: -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A).
- `cispo`: -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp (tinker/MiniMax-M1 CISPO form).

Aggregation is the token mean over masked tokens (tinker sums instead; a mean keeps the learning rate
independent of batch size). For data-parallel training pass `denom` = the GLOBAL masked-token count
divided by the world size so that DDP's gradient average equals the global token mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

EPS = 1e-6
# exp() guard: a log-ratio beyond +-20 means the sample is corrupt, not informative; the clamp keeps the
# loss finite (those tokens then get no gradient) instead of poisoning the whole step with inf.
MAX_LOG_RATIO = 20.0


def _lookup(registry: dict[str, Callable], name: str, kind: str) -> Callable:
    try:
        return registry[name]
    except KeyError:
        valid = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; valid names: {valid}") from None


# ----------------------------------------------------------------------------------------------------
# Advantages: one scalar per sample, broadcast over its tokens by the caller.
# ----------------------------------------------------------------------------------------------------


def grpo_group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Group-relative advantages (r - mean_g) / (std_g + eps).

    Args:
        rewards: (B,) float rewards.
        group_index: (B,) long, 0..G-1: which group each sample belongs to.
    Returns:
        (B,) float advantages. std is the population std of the group (a singleton group gets 0).
    """
    rewards = rewards.float()
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    count = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_index, torch.ones_like(rewards))
    mean = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_index, rewards) / count
    centred = rewards - mean[group_index]
    var = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_index, centred**2) / count
    return centred / (var.sqrt()[group_index] + eps)


def batch_norm_advantages(rewards: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Batch-level normalisation (r - mean) / (std + eps), MetaClaw's rule for ungrouped samples.

    MetaClaw's fallbacks are kept: when all rewards are equal the result is the centred rewards (zeros),
    and a batch of one sample gets its raw reward (else a lone sample would carry no signal).

    Args:
        rewards: (B,) float.
    Returns:
        (B,) float.
    """
    rewards = rewards.float()
    if rewards.numel() == 1:
        return rewards.clone()
    centred = rewards - rewards.mean()
    std = centred.pow(2).mean().sqrt()
    if std < 1e-8:
        return centred
    return centred / (std + eps)


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "grpo_group": grpo_group_advantages,
    "batch_norm": batch_norm_advantages,
}


def get_advantage_fn(name: str) -> Callable[..., torch.Tensor]:
    return _lookup(ADVANTAGES, name, "advantage estimator")


def compute_advantages(rewards: torch.Tensor, group_ids: Sequence[str | None], eps: float = EPS, *,
                       grouped: str = "grpo_group", loose: str = "batch_norm") -> torch.Tensor:
    """Dispatcher through `ADVANTAGES`: `grouped` over samples that carry a group_id (called with the
    group index), `loose` over the rest.

    A GRPO group arrives whole (train/replay_store.py leases groups whole), so its mean and std are
    over every member, zero-reward and zero-mask members included (the loss mask keeps their tokens
    out of the loss, not their rewards out of the baseline).

    Args:
        rewards: (B,) float.
        group_ids: B entries; None = the sample was not sampled as part of a group.
    Returns:
        (B,) float advantages.
    """
    if rewards.shape[0] != len(group_ids):
        raise ValueError(f"{rewards.shape[0]} rewards but {len(group_ids)} group ids")
    out = torch.zeros(rewards.shape[0], dtype=torch.float32)
    in_group = [i for i, g in enumerate(group_ids) if g is not None]
    alone = [i for i, g in enumerate(group_ids) if g is None]
    if in_group:
        keys: dict[str, int] = {}
        index = torch.tensor([keys.setdefault(group_ids[i], len(keys)) for i in in_group], dtype=torch.long)
        out[in_group] = get_advantage_fn(grouped)(rewards[in_group], index, eps)
    if alone:
        out[alone] = get_advantage_fn(loose)(rewards[alone], eps)
    return out


# ----------------------------------------------------------------------------------------------------
# Token-level policy losses: (B, R) in, (B, R) per-token loss out (not yet masked or reduced).
# ----------------------------------------------------------------------------------------------------


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def importance_sampling_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """-(r * A) per token; r = exp(logp - old_logp). All (B, R). Clip eps are unused (no clipping)."""
    return -(_ratio(logp, old_logp) * adv)


def ppo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """Clipped surrogate -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) per token. All (B, R)."""
    ratio = _ratio(logp, old_logp)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(ratio * adv, clipped * adv)


def cispo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp per token. All (B, R).

    The clipped weight is detached, so every token keeps a gradient (unlike PPO, which zeroes the
    gradient of clipped tokens); the clip only bounds how much weight a token gets.
    """
    weight = _ratio(logp, old_logp).clamp(1.0 - eps_low, 1.0 + eps_high).detach()
    return -(weight * adv * logp)


POLICY_LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "importance_sampling": importance_sampling_loss,
    "ppo": ppo_loss,
    "cispo": cispo_loss,
}


def get_policy_loss_fn(name: str) -> Callable[..., torch.Tensor]:
    return _lookup(POLICY_LOSSES, name, "policy loss")


def opd_advantages(advantages: torch.Tensor, old_logp: torch.Tensor, teacher_logp: torch.Tensor,
                   teacher_mask: torch.Tensor, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy distillation as per-token advantages (MetaClaw's OPD; the Tinker recipe).

    The reverse KL to the teacher on the sampled tokens, KL(pi || pi_T) = E_{x ~ pi}[log pi(x) - log pi_T(x)],
    is estimated per token by `old_logp - teacher_logp` (the behaviour policy's logprob: the samples came
    from it); its negative, `weight * (teacher_logp - old_logp)`, is added to each token's advantage, so the
    policy-gradient loss raises tokens the teacher likes more than the policy did and lowers the others.
    Tokens without a teacher logprob (`teacher_mask` 0) add nothing.

    advantages: (B,) or (B, R); old_logp, teacher_logp, teacher_mask: (B, R). Returns ((B, R) advantages,
    (B, R) the per-token reverse-KL estimate, 0 where masked).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(old_logp)
    rkl = (old_logp - teacher_logp) * teacher_mask
    return advantages - weight * rkl, rkl


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(p_theta || p_ref) per token: exp(d) - d - 1, d = ref_logp - logp.

    Non-negative, unbiased, low variance. (B, R) in, (B, R) out.
    """
    d = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(d) - d - 1.0


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def policy_loss(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    denom: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO loss of one (micro-)batch: token mean of the named policy loss (+ kl_coef * k3 KL).

    Args:
        name: one of POLICY_LOSSES.
        logp: (B, R) learner logprobs of the sampled tokens (requires grad).
        old_logp: (B, R) engine (behaviour) logprobs of the same tokens.
        advantages: (B,) per-sample or (B, R) per-token advantages.
        mask: (B, R) 1 = token counts, 0 = ignored (padding / masked).
        clip_eps, clip_eps_high: clip range [1 - clip_eps, 1 + (clip_eps_high or clip_eps)].
        kl_coef, ref_logp: optional KL to the base, ref_logp (B, R) from the adapter-disabled model.
        denom: divisor of the masked sums; default = number of masked tokens here (min 1).
    Returns:
        (scalar loss, detached stats: masked sums of ratio, clipped-token count, kl, tokens).
    """
    fn = get_policy_loss_fn(name)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    mask = mask.to(logp.dtype)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    per_token = fn(logp, old_logp, advantages, clip_eps, eps_high)
    if denom is None:
        denom = mask.sum().clamp(min=1.0)
    loss = masked_sum(per_token, mask) / denom
    with torch.no_grad():
        ratio = _ratio(logp.detach(), old_logp)
        clipped = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + eps_high)).to(mask.dtype)
        stats = {
            "tokens": mask.sum(),
            "ratio_sum": masked_sum(ratio, mask),
            "clipped_tokens": masked_sum(clipped, mask),
            "pg_loss_sum": masked_sum(per_token.detach(), mask),
        }
    if kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (logprobs with the adapter disabled)")
        kl = kl_k3(logp, ref_logp)
        loss = loss + kl_coef * masked_sum(kl, mask) / denom
        stats["kl_sum"] = masked_sum(kl.detach(), mask)
    return loss, stats
