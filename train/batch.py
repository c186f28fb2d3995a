"""Collate `Sample`s into padded tensors for one forward pass; token-exact (ids used as stored).

Layout per row: [left pad][prompt][response][right pad], so every response starts at column P
(= longest prompt). The model then only needs logits for the last R columns (`logits_to_keep`), the
same trick trl uses, and those logits line up with the response tokens without per-row gathers:

    input_ids  = full[:, :-1]          (B, P + R - 1)  the last column predicts nothing, dropped
    logits     = model(...)[:, -R:]    (B, R, V)       column P-1+j predicts response token j
    targets    = response_ids          (B, R)

`position_ids` count real tokens only (left pads do not shift positions), so logprobs match what the
engine computed for the unpadded sequence. Each row also carries the sampling parameters its response
was drawn with (`Sample.sampling`), so the learner's logprobs are taken under the same distribution as
the engine's (train/step.py `sampling_logprobs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.contracts import Sample


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) long, L = P + R - 1
    attention_mask: torch.Tensor  # (B, L) long, 1 = real token
    position_ids: torch.Tensor  # (B, L) long, 0.. over real tokens
    targets: torch.Tensor  # (B, R) long, sampled response ids (0 on padding)
    mask: torch.Tensor  # (B, R) float, loss mask (0 on padding, masked or non-finite-logprob tokens)
    old_logprobs: torch.Tensor  # (B, R) float, engine logprobs of `targets` (0 on padding)
    advantages: torch.Tensor  # (B,) float, one per sample
    temperature: torch.Tensor  # (B,) float32, each row's sampling temperature (< 1e-5 = greedy)
    top_k: torch.Tensor  # (B,) long, 0 = off
    top_p: torch.Tensor  # (B,) float32, 1 = off
    sample_ids: list[str]
    num_tokens: int  # real prompt + response tokens: the unit of throughput numbers
    teacher_logprobs: torch.Tensor | None = None  # (B, R) OPD teacher logprobs of `targets` (0 where none)
    teacher_mask: torch.Tensor | None = None  # (B, R) 1 where the sample has a finite teacher logprob

    @property
    def response_len(self) -> int:
        return self.targets.shape[1]

    def to(self, device: torch.device | str) -> Batch:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return Batch(**moved)


def collate(samples: Sequence[Sample], advantages: torch.Tensor | Sequence[float], pad_id: int = 0) -> Batch:
    """Pad `samples` into a `Batch`.

    Args:
        samples: B samples with non-empty prompt_ids and response_ids.
        advantages: (B,) one advantage per sample (computed over the whole leased batch).
        pad_id: id written into padding (never attended to, never trained on).
    """
    if not samples:
        raise ValueError("cannot collate an empty batch")
    for s in samples:
        if not s.prompt_ids or not s.response_ids:
            raise ValueError(f"sample {s.sample_id} needs a non-empty prompt and response")
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    if adv.shape != (len(samples),):
        raise ValueError(f"need one advantage per sample: {tuple(adv.shape)} for {len(samples)} samples")
    b = len(samples)
    p = max(len(s.prompt_ids) for s in samples)
    r = max(len(s.response_ids) for s in samples)
    full = torch.full((b, p + r), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    targets = torch.full((b, r), pad_id, dtype=torch.long)
    mask = torch.zeros((b, r), dtype=torch.float32)
    old = torch.zeros((b, r), dtype=torch.float32)
    for i, s in enumerate(samples):
        lp, lr = len(s.prompt_ids), len(s.response_ids)
        full[i, p - lp : p] = torch.tensor(s.prompt_ids)
        full[i, p : p + lr] = torch.tensor(s.response_ids)
        attn[i, p - lp : p + lr] = 1
        targets[i, :lr] = full[i, p : p + lr]
        logps = torch.tensor(s.response_logprobs, dtype=torch.float32)
        # NOTE: a non-finite engine logprob cannot weight a ratio; that token is masked, not the sample.
        finite = torch.isfinite(logps)
        old[i, :lr] = torch.where(finite, logps, torch.zeros_like(logps))
        mask[i, :lr] = torch.tensor(s.loss_mask, dtype=torch.float32) * finite.float()
    teacher = teacher_mask = None
    if any(s.teacher_logprobs is not None for s in samples):
        teacher = torch.zeros((b, r), dtype=torch.float32)
        teacher_mask = torch.zeros((b, r), dtype=torch.float32)
        for i, s in enumerate(samples):
            if s.teacher_logprobs is not None:
                t = torch.tensor(s.teacher_logprobs, dtype=torch.float32)
                ok = torch.isfinite(t)
                teacher[i, : len(t)] = torch.where(ok, t, torch.zeros_like(t))
                teacher_mask[i, : len(t)] = ok.float() * mask[i, : len(t)]
    positions = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return Batch(
        input_ids=full[:, :-1].contiguous(),
        attention_mask=attn[:, :-1].contiguous(),
        position_ids=positions[:, :-1].contiguous(),
        targets=targets,
        mask=mask,
        old_logprobs=old,
        advantages=adv,
        temperature=torch.tensor([s.sampling.temperature for s in samples], dtype=torch.float32),
        top_k=torch.tensor([s.sampling.top_k for s in samples], dtype=torch.long),
        top_p=torch.tensor([s.sampling.top_p for s in samples], dtype=torch.float32),
        sample_ids=[s.sample_id for s in samples],
        num_tokens=sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
        teacher_logprobs=teacher,
        teacher_mask=teacher_mask,
    )


def chunk_indices(n: int, parts: int) -> list[list[int]]:
    """Split range(n) into `parts` contiguous chunks of near-equal size (trailing ones may be empty)."""
    size = max(1, math.ceil(n / parts))
    return [list(range(i * size, min(n, (i + 1) * size))) for i in range(parts)]


def padded_tokens(shapes: Sequence[tuple[int, int]]) -> int:
    """Tokens a collated batch of (prompt, response) lengths occupies: prompts left-padded to the longest,
    responses right-padded to the longest (`collate`)."""
    return len(shapes) * (max(p for p, _ in shapes) + max(r for _, r in shapes)) if shapes else 0


def plan_micro_batches(shapes: Sequence[tuple[int, int]], parts: int, max_tokens: int | None) -> list[list[int]]:
    """Positions of `shapes` (sorted by length) in micro-batches: `parts` near-equal contiguous chunks
    (`chunk_indices`), each split further so no micro-batch's padded size exceeds `max_tokens` (None: no
    limit); a sample longer than the limit is a micro-batch of its own. A micro-batch of one sample has no
    padding at all, so its attention runs unmasked (causal), as a bare forward of that sequence would."""
    out: list[list[int]] = []
    for chunk in chunk_indices(len(shapes), parts):
        if max_tokens is None or not chunk:
            out.append(chunk)
            continue
        cur: list[int] = []
        for i in chunk:
            if cur and padded_tokens([shapes[j] for j in (*cur, i)]) > max_tokens:
                out.append(cur)
                cur = []
            cur.append(i)
        out.append(cur)
    return out
