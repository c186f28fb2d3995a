"""GRPO math: advantages, policy losses, KL; fixed seeds, loop references, invariants."""

from __future__ import annotations

import math

import pytest
import torch

from train import algos


def loop_group_advantages(rewards: list[float], groups: list[int], eps: float = algos.EPS) -> list[float]:
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / len(members))
        out.append((r - mean) / (std + eps))
    return out


def test_group_advantages_vectorised_matches_loop() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(32, generator=g)
    groups = torch.randint(0, 5, (32,), generator=g)
    got = algos.grpo_group_advantages(rewards, groups)
    want = torch.tensor(loop_group_advantages(rewards.tolist(), groups.tolist()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for k in groups.unique():  # each group is centred and (nearly) unit-scaled
        sel = got[groups == k]
        assert abs(sel.mean().item()) < 1e-5
        if sel.numel() > 1 and rewards[groups == k].std() > 0:
            assert abs(sel.pow(2).mean().sqrt().item() - 1.0) < 1e-3


def test_batch_norm_matches_metaclaw_rules() -> None:
    r = torch.tensor([1.0, -1.0, 0.0, 1.0])
    mean, std = r.mean(), r.std(unbiased=False)
    torch.testing.assert_close(algos.batch_norm_advantages(r), (r - mean) / (std + algos.EPS))
    torch.testing.assert_close(algos.batch_norm_advantages(torch.tensor([1.0, 1.0])), torch.zeros(2))
    torch.testing.assert_close(algos.batch_norm_advantages(torch.tensor([0.5])), torch.tensor([0.5]))


def test_dispatcher_groups_where_set_and_batch_for_the_rest() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, -1.0, 0.5, 3.0])
    group_ids = ["a", "a", None, None, "b", "b"]
    got = algos.compute_advantages(rewards, group_ids)
    torch.testing.assert_close(got[[0, 1]], algos.grpo_group_advantages(rewards[[0, 1]], torch.tensor([0, 0])))
    torch.testing.assert_close(got[[4, 5]], algos.grpo_group_advantages(rewards[[4, 5]], torch.tensor([0, 0])))
    torch.testing.assert_close(got[[2, 3]], algos.batch_norm_advantages(rewards[[2, 3]]))
    with pytest.raises(ValueError, match="group ids"):
        algos.compute_advantages(rewards, group_ids[:2])


def _inputs(seed: int = 0, b: int = 4, r: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, r, generator=g) * 5
    logp = (old + 0.3 * torch.randn(b, r, generator=g)).requires_grad_(True)
    adv = torch.randn(b, generator=g)
    mask = (torch.rand(b, r, generator=g) > 0.3).float()
    return logp, old, adv, mask


@pytest.mark.parametrize("name", sorted(algos.POLICY_LOSSES))
def test_ratio_one_gives_minus_mean_advantage(name: str) -> None:
    logp, old, adv, mask = _inputs()
    same = old.clone().requires_grad_(True)
    loss, _ = algos.policy_loss(name, same, old, adv, mask)
    per_token_adv = adv[:, None].expand_as(mask)
    want = -(per_token_adv * mask).sum() / mask.sum()
    if name == "cispo":  # -sg(1) * A * logp: the value carries logp, the gradient is -A
        want = -(per_token_adv * old * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, want)
    loss.backward()
    # At r = 1 every loss has the REINFORCE gradient -A / n_tokens on each masked token.
    torch.testing.assert_close(same.grad, -per_token_adv * mask / mask.sum())


@pytest.mark.parametrize("name", sorted(algos.POLICY_LOSSES))
def test_vectorised_loss_matches_per_token_loop(name: str) -> None:
    logp, old, adv, mask = _inputs(seed=1)
    loss, stats = algos.policy_loss(name, logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    total, n = 0.0, 0
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            lp, o, a = logp[i, t].item(), old[i, t].item(), adv[i].item()
            ratio = math.exp(lp - o)
            clipped = min(max(ratio, 0.8), 1.28)
            term = {
                "importance_sampling": -ratio * a,
                "ppo": -min(ratio * a, clipped * a),
                "cispo": -clipped * a * lp,
            }[name]
            total, n = total + term, n + 1
    assert loss.item() == pytest.approx(total / n, rel=1e-5)
    assert stats["tokens"].item() == n


@pytest.mark.parametrize("name", sorted(algos.POLICY_LOSSES))
def test_masked_tokens_get_no_gradient_and_do_not_change_the_loss(name: str) -> None:
    logp, old, adv, mask = _inputs(seed=2)
    loss, _ = algos.policy_loss(name, logp, old, adv, mask)
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    poisoned = old.clone()
    poisoned[mask == 0] = 123.0  # garbage under the mask must not matter
    logp2 = logp.detach().clone().requires_grad_(True)
    loss2, _ = algos.policy_loss(name, logp2, poisoned, adv, mask)
    torch.testing.assert_close(loss, loss2)


def test_ppo_clips_gradient_outside_the_trust_region() -> None:
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.5, -0.5]], requires_grad=True)  # r = 1.65 and 0.61
    loss, stats = algos.policy_loss("ppo", logp, old, torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    assert logp.grad[0, 0] == 0  # A > 0 and r > 1 + eps: clipped, no push further
    assert logp.grad[0, 1] != 0  # A > 0 and r < 1 - eps: min() keeps the unclipped term
    assert stats["clipped_tokens"].item() == 2


def test_data_parallel_split_equals_global_token_mean() -> None:
    logp, old, adv, mask = _inputs(seed=3, b=6)
    full, _ = algos.policy_loss("importance_sampling", logp, old, adv, mask)
    world = 2
    denom = mask.sum() / world  # per-worker loss scaled so that DDP's average = global mean
    parts = [
        algos.policy_loss("importance_sampling", logp[i::world], old[i::world], adv[i::world],
                          mask[i::world], denom=denom)[0]
        for i in range(world)
    ]
    torch.testing.assert_close(sum(parts) / world, full)


def test_kl_k3_is_zero_at_reference_and_positive_elsewhere() -> None:
    logp, old, adv, mask = _inputs(seed=4)
    torch.testing.assert_close(algos.kl_k3(old, old), torch.zeros_like(old))
    assert torch.all(algos.kl_k3(logp.detach(), old) >= 0)
    base, _ = algos.policy_loss("ppo", logp, old, adv, mask)
    with_kl, stats = algos.policy_loss("ppo", logp, old, adv, mask, kl_coef=0.1, ref_logp=old)
    kl_mean = stats["kl_sum"] / mask.sum()
    torch.testing.assert_close(with_kl, base + 0.1 * kl_mean)
    with pytest.raises(ValueError, match="ref_logp"):
        algos.policy_loss("ppo", logp, old, adv, mask, kl_coef=0.1)


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="cispo, importance_sampling, ppo"):
        algos.get_policy_loss_fn("grpo")
    with pytest.raises(ValueError, match="batch_norm, grpo_group"):
        algos.get_advantage_fn("gae")


def test_ratio_is_guarded_against_overflow() -> None:
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-1000.0]])  # a corrupt engine logprob
    loss, _ = algos.policy_loss("importance_sampling", logp, old, torch.tensor([1.0]), torch.ones(1, 1))
    assert torch.isfinite(loss)


def test_opd_adds_the_negative_reverse_kl_to_each_tokens_advantage() -> None:
    adv = torch.tensor([1.0, -1.0])
    old = torch.tensor([[-2.0, -3.0, -1.0], [-1.0, -1.0, -1.0]])
    teacher = torch.tensor([[-1.0, -5.0, -1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # the second sample has no teacher logprobs
    out, rkl = algos.opd_advantages(adv, old, teacher, mask, weight=0.5)
    # token 0: the teacher likes it more (+1 nat) -> advantage up; token 1: less (-2) -> down; token 2: same
    assert out.tolist() == [[1.5, 0.0, 1.0], [-1.0, -1.0, -1.0]]
    assert rkl.tolist() == [[-1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    same, _ = algos.opd_advantages(adv, old, old, torch.ones_like(old), weight=3.0)
    assert torch.equal(same, adv[:, None].expand_as(old))  # a teacher that agrees changes nothing
