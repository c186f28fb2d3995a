"""GRPO step on the tiny model without Ray: token exactness of the padded batch, accumulation, direction."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from core.config import LoRAConfig, TrainConfig
from core.contracts import Sample, Sampling
from train.batch import collate, padded_tokens, plan_micro_batches
from train.model import DDPBackend, build_peft_model
from train.step import shard_micro_batches, token_logprobs, train_step

VOCAB = 4096


def build_tiny_model(out: Path) -> Path:
    """A model-only tiny Qwen2 (no tokenizer: samples carry token ids), seeded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def make(prompt: list[int], response: list[int], reward: float = 1.0, mask=None) -> Sample:
    return Sample(session_id="s", turn_index=0, prompt_ids=prompt, response_ids=response,
                  response_logprobs=[-8.3] * len(response), reward=reward,
                  loss_mask=mask or [1] * len(response), skill_generation=0)


def cfg(**kw) -> TrainConfig:
    return TrainConfig(lora=LoRAConfig(rank=4, alpha=8), lr=1e-2, **kw)


def test_padded_batch_logprobs_equal_unpadded_per_sample(model_path: str) -> None:
    model = build_peft_model(model_path, cfg(), torch.device("cpu")).eval()
    samples = [make([5, 6, 7, 8, 9], [10, 11]), make([12], [13, 14, 15, 16]), make([17, 18], [19])]
    batch = collate(samples, [0.0, 0.0, 0.0])
    with torch.no_grad():
        got = token_logprobs(model, batch)
        for i, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
            want = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
            torch.testing.assert_close(got[i, : len(s.response_ids)], want, rtol=1e-4, atol=1e-4)
    assert batch.mask.sum().item() == 7 and batch.num_tokens == 15


def test_padded_batch_logprobs_follow_each_rows_sampling(model_path: str) -> None:
    """Rows sampled with different temperature/top-k/top-p keep their own processing in one padded batch."""
    model = build_peft_model(model_path, cfg(), torch.device("cpu")).eval()
    rows = [Sampling(temperature=0.7, top_p=0.95), Sampling(temperature=1.4, top_k=3000), Sampling()]
    samples = [make([5, 6, 7, 8, 9], [10, 11]), make([12], [13, 14, 15, 16]), make([17, 18], [19])]
    for s, sp in zip(samples, rows, strict=True):
        s.sampling = sp
    with torch.no_grad():
        got = token_logprobs(model, collate(samples, [0.0, 0.0, 0.0]))
        for i, s in enumerate(samples):
            alone = token_logprobs(model, collate([s], [0.0]))[0]
            torch.testing.assert_close(got[i, : len(s.response_ids)], alone, rtol=1e-4, atol=1e-4)
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
            raw = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
            differs = not torch.allclose(alone, raw, atol=1e-4)
            assert differs == (s.sampling != Sampling()), (i, alone, raw)


def _lora_after_one_step(model_path: str, samples, **kw) -> dict[str, torch.Tensor]:
    c = cfg(**kw)
    model = build_peft_model(model_path, c, torch.device("cpu"))
    train_step(DDPBackend(model, c, torch.device("cpu"), world=1), samples, c)
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_gradient_accumulation_equals_one_big_batch(model_path: str) -> None:
    samples = [make([3 + i, 4], [20 + i, 21, 22][: 1 + i % 3], reward=float(i % 2)) for i in range(6)]
    one = _lora_after_one_step(model_path, samples, grad_accum=1)
    three = _lora_after_one_step(model_path, copy.deepcopy(samples), grad_accum=4)  # one filler micro-batch
    for k in one:
        torch.testing.assert_close(one[k], three[k], rtol=1e-4, atol=1e-6)


def test_a_token_budget_splits_micro_batches_and_equals_one_big_batch(model_path: str) -> None:
    samples = [make([3 + i, 4] * (1 + i), [20 + i, 21, 22][: 1 + i % 3], reward=float(i % 2)) for i in range(6)]
    one = _lora_after_one_step(model_path, samples)
    split = _lora_after_one_step(model_path, copy.deepcopy(samples), micro_batch_tokens=12)
    # Unpadded micro-batches sum the same gradients in another order (and attend without padding), and Adam
    # divides by sqrt(v): a weight whose gradient is ~0 moves by a float-noise fraction of a step. CI saw
    # 2.2e-6 on one of 512 weights; atol 1e-5 is 0.1% of one step at the lr used here (1e-2), far below
    # what a wrong token sum or a lost micro-batch changes (a whole step).
    for k in one:
        torch.testing.assert_close(one[k], split[k], rtol=1e-4, atol=1e-5)


def test_micro_batch_plans_respect_the_budget_and_every_worker_runs_as_many():
    shapes = [(2, 1), (3, 2), (3, 3), (8, 2), (20, 4)]  # sorted by length, as the shard is
    assert plan_micro_batches(shapes, 1, None) == [[0, 1, 2, 3, 4]]
    assert plan_micro_batches(shapes, 2, None) == [[0, 1, 2], [3, 4]]
    plan = plan_micro_batches(shapes, 1, 12)
    assert plan == [[0, 1], [2], [3], [4]]  # (3+2)*2=10; adding (3,3) pads to 18 > 12; 24 alone > 12: alone
    assert all(padded_tokens([shapes[i] for i in c]) <= 12 or len(c) == 1 for c in plan)
    samples = [make([1] * p, [2] * r) for p, r in [(2, 1), (30, 4), (2, 1), (3, 2)]]
    adv = torch.zeros(4)
    # Worker 0 holds samples 0 and 2 (one micro-batch of 6 tokens); worker 1 holds 1 and 3, which the budget
    # splits in two: worker 0 runs a zero-weight filler so both call backward twice.
    w0, w1 = (shard_micro_batches(samples, adv, r, 2, 1, max_tokens=16) for r in (0, 1))
    assert len(w0) == len(w1) == 2
    assert w0[1].sample_ids == [] and w0[1].mask.sum() == 0 and w0[0].input_ids.shape[0] == 2
    assert [b.input_ids.shape[0] for b in w1] == [1, 1]


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "cispo"])
def test_steps_raise_logprob_of_rewarded_tokens(model_path: str, loss: str) -> None:
    c = cfg(loss=loss, batch_size=8)
    model = build_peft_model(model_path, c, torch.device("cpu"))
    backend = DDPBackend(model, c, torch.device("cpu"), world=1)
    good, bad = 100, 200
    samples = [make([7, 8, 9], [good, good], 1.0) for _ in range(4)] + [make([7, 8, 9], [bad, bad], -1.0) for _ in range(4)]
    probe = collate([samples[0], samples[-1]], [0.0, 0.0])
    with torch.no_grad():
        before = token_logprobs(model, probe)[:, 0]
    for _ in range(5):
        metrics = train_step(backend, samples, c)
    with torch.no_grad():
        after = token_logprobs(model, probe)[:, 0]
    assert after[0] > before[0] + 0.1 and after[1] < before[1] - 0.1, (before, after)
    assert metrics["tokens_trained"] == 16 and metrics["reward_mean"] == 0.0


def test_kl_to_base_is_zero_before_training_and_uses_disabled_adapter(model_path: str) -> None:
    c = cfg(kl_coef=0.5)
    model = build_peft_model(model_path, c, torch.device("cpu"))
    backend = DDPBackend(model, c, torch.device("cpu"), world=1)
    samples = [make([1, 2], [3, 4], 1.0), make([1, 2], [5, 6], -1.0)]
    m = train_step(backend, samples, c)
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at 0: policy == base
    m = train_step(backend, samples, c)
    assert m["kl"] > 0  # after one update the adapter moved the policy away from the base


def test_bf16_step_keeps_lora_weights_and_logprobs_in_fp32(model_path: str) -> None:
    c = cfg(bf16=True)
    model = build_peft_model(model_path, c, torch.device("cpu"))
    lora = [p for p in model.parameters() if p.requires_grad]
    assert lora and all(p.dtype == torch.float32 for p in lora)  # optimizer state stays fp32
    backend = DDPBackend(model, c, torch.device("cpu"), world=1)
    m = train_step(backend, [make([1, 2], [3, 4], 1.0), make([1, 2], [5, 6], -1.0)], c)
    assert m["tokens_trained"] == 4 and torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0


def test_opd_reaches_the_loss_and_pulls_the_policy_towards_the_teacher(model_path: str) -> None:
    """With zero reward (no policy-gradient signal), OPD alone raises the token the teacher prefers and
    lowers the one it dislikes; at opd_weight 0, or without teacher logprobs, the step is unchanged."""
    liked, disliked = 100, 200

    def with_teacher(response, teacher):
        s = make([7, 8, 9], response, 0.0)
        s.teacher_logprobs = [teacher] * len(response)
        return s

    samples = [with_teacher([liked, liked], -1.0) for _ in range(2)] + [with_teacher([disliked, disliked], -20.0)
                                                                       for _ in range(2)]
    batch = collate(samples, [0.0] * 4)
    assert batch.teacher_logprobs[0].tolist() == [-1.0, -1.0] and batch.teacher_mask.sum() == 8
    assert collate([make([1], [2])], [0.0]).teacher_logprobs is None
    c = cfg(opd_weight=1.0, batch_size=4)
    model = build_peft_model(model_path, c, torch.device("cpu"))
    backend = DDPBackend(model, c, torch.device("cpu"), world=1)
    probe = collate([samples[0], samples[-1]], [0.0, 0.0])
    with torch.no_grad():
        before = token_logprobs(model, probe)[:, 0]
    m = train_step(backend, samples, c)  # one step: the samples' engine logprobs are the behaviour policy
    with torch.no_grad():
        after = token_logprobs(model, probe)[:, 0]
    assert after[0] > before[0] + 0.05 and after[1] < before[1] - 0.1, (before, after)
    assert m["opd_tokens"] == 8 and m["opd_kl"] == pytest.approx(((-8.3 + 1) * 4 + (-8.3 + 20) * 4) / 8)
    # Off, or no teacher logprobs: zero advantages everywhere, so the LoRA weights do not move.
    start = _lora_after_one_step(model_path, [make([7, 8, 9], [liked], 0.0)], opd_weight=0.0)
    off = _lora_after_one_step(model_path, samples, opd_weight=0.0)
    for k in start:
        torch.testing.assert_close(start[k], off[k])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gathered_logprobs_equal_log_softmax_then_gather(dtype) -> None:
    """`gathered_logprobs` is log_softmax(logits).gather(targets) without the (.., V) copy, any rank."""
    from train.step import gathered_logprobs

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 97, generator=g) * 4).to(dtype)
    targets = torch.randint(0, 97, (3, 5), generator=g)
    want = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    got = gathered_logprobs(logits, targets)
    assert got.shape == (3, 5)
    torch.testing.assert_close(got.float(), want, atol=0.05 if dtype == torch.bfloat16 else 1e-5, rtol=0)
    torch.testing.assert_close(gathered_logprobs(logits[0], targets[0]).float(), want[0],
                               atol=0.05 if dtype == torch.bfloat16 else 1e-5, rtol=0)


def test_the_training_worker_does_not_import_trl() -> None:
    """trl's module costs ~2.5 s of every window's worker start-up (benchmarks/window_efficiency.py);
    on CPU the learner runs the same math without it (trl stays the GPU path: its fused kernel)."""
    import subprocess
    import sys

    code = "import sys, train.grpo; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


def test_the_training_worker_does_not_import_scikit_learn(model_path: str) -> None:
    """transformers imports scikit-learn (with scipy.stats, ~1 s here) when its generation utilities load,
    only for assisted decoding, which a trainer never runs; the worker is a fresh process every window, so
    that second is part of every window's fixed cost (benchmarks/window_efficiency.py)."""
    import subprocess
    import sys

    code = ("import sys, torch, train.model as m; from core.config import TrainConfig; "
            f"m.build_peft_model({model_path!r}, TrainConfig(), torch.device('cpu')); print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"
