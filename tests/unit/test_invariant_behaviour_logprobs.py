"""Issue 12 item 6, the pure parts: the engine is asked for the sampling distribution's logprobs, the turn
keeps the sampling parameters the engine actually ran (defaults included), and the trainer's processing
of logits is vLLM's own (checked against vLLM's sampler functions, fp32 on CPU).

The end-to-end check through the real stack is tests/integration/test_invariant_logprobs.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from core.config import EngineConfig, ModelConfig, TrainConfig
from core.contracts import Sample, Sampling
from serve.capture import TappedEngineClient
from train.batch import collate
from train.step import micro_loss, sampling_logprobs

ROWS = [  # (temperature, top_k, top_p): tempered + top-p, tempered + top-k, both, greedy, untouched
    (0.7, 0, 0.9), (1.3, 20, 1.0), (0.5, 50, 0.8), (0.0, 0, 1.0), (1.0, 0, 1.0),
]


def _vllm_processed(logits: torch.Tensor, temperature: float, k: int, p: float) -> torch.Tensor:
    """vLLM 0.32's Sampler on one request's (R, V) logits with logprobs_mode=processed_logprobs."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    x = logits.clone()
    if temperature < 1e-5:  # greedy: SamplingParams resets top_k/top_p; logprobs at temperature 1
        return x.log_softmax(-1, dtype=torch.float32)
    x.div_(torch.full((x.shape[0], 1), temperature))
    r, v = x.shape
    kk = torch.full((r,), k if 0 < k < v else v, dtype=torch.int32)
    pp = torch.full((r,), p, dtype=torch.float32)
    return apply_top_k_top_p(x, kk, pp).log_softmax(-1, dtype=torch.float32)


def test_trainer_processing_is_vllms_sampler_processing_per_row():
    gen = torch.Generator().manual_seed(0)
    b, r, v = len(ROWS), 7, 512
    logits = torch.randn(b, r, v, generator=gen) * 3.0  # peaked enough that top-p keeps a real subset
    refs = torch.stack([_vllm_processed(logits[i], *ROWS[i]) for i in range(b)])  # (B, R, V)
    # Targets drawn from each row's own processed distribution, as the engine draws them.
    targets = torch.multinomial(refs.exp().reshape(b * r, v), 1, generator=gen).reshape(b, r)
    got = sampling_logprobs(logits, targets,
                            torch.tensor([t for t, _, _ in ROWS]), torch.tensor([k for _, k, _ in ROWS]),
                            torch.tensor([p for _, _, p in ROWS]))
    want = refs.gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    raw = logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    assert (got[:3] - raw[:3]).abs().max() > 0.1  # processing really changes the numbers ...
    torch.testing.assert_close(got[3:], raw[3:])  # ... except greedy and untouched rows


def test_engine_is_asked_for_processed_logprobs():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from serve.vllm_engine import vllm_cli_args

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        vllm_cli_args("/m", ModelConfig(), EngineConfig()))
    assert args.logprobs_mode == "processed_logprobs"


class _Inner:
    """The engine client under the tap: yields one finished output per choice."""

    def __init__(self) -> None:
        self.seen = None

    async def generate(self, prompt, params, request_id, *args, **kwargs):
        self.seen = params
        lp = {5: SimpleNamespace(logprob=-0.5)}
        outputs = [SimpleNamespace(index=i, token_ids=[5], logprobs=[lp], text="x", finish_reason="length")
                   for i in range(params.n)]
        yield SimpleNamespace(prompt_token_ids=[1, 2], outputs=outputs, finished=True)


@pytest.mark.parametrize(("kwargs", "want"), [
    ({"temperature": 0.7, "top_p": 0.9, "n": 2}, Sampling(temperature=0.7, top_p=0.9, top_k=0)),
    ({"temperature": 1.3, "top_k": 20}, Sampling(temperature=1.3, top_p=1.0, top_k=20)),
    ({"temperature": 0.0, "top_k": 20, "top_p": 0.5}, Sampling(temperature=0.0, top_p=1.0, top_k=0)),  # greedy
    ({}, Sampling(temperature=1.0, top_p=1.0, top_k=0)),  # vLLM's defaults count too
])
def test_capture_keeps_the_sampling_params_the_engine_ran(kwargs, want):
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **kwargs)
    tap = TappedEngineClient(inner := _Inner())
    cap = tap.register("abc")

    async def run() -> None:
        async for _ in tap.generate("p", params, "chatcmpl-abc"):
            pass

    asyncio.run(run())
    assert cap.sampling == want and inner.seen.logprobs == 0
    assert [c.logprobs for c in cap.choices.values()] == [[-0.5]] * params.n


def test_tokens_outside_the_learners_kept_set_are_masked_not_nan():
    """A target the learner's top-k excludes (-inf logprob) must not turn CISPO or the KL into nan."""
    v = 16

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(torch.linspace(0.0, 3.0, v))

        def forward(self, input_ids, logits_to_keep, **kw):
            return SimpleNamespace(logits=self.bias.expand(input_ids.shape[0], logits_to_keep, v))

    class Backend:
        model = Model()

        def autocast(self):
            return torch.autocast("cpu", enabled=False)

    sample = Sample(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[v - 1, 0],  # 0 is outside top-2
                    response_logprobs=[-0.7, -0.7], reward=1.0, loss_mask=[1, 1], skill_generation=0,
                    sampling=Sampling(temperature=1.0, top_k=2))
    batch = collate([sample], [1.0])
    loss, stats = micro_loss(Backend(), batch, TrainConfig(loss="cispo"), denom=2.0)
    loss.backward()
    assert torch.isfinite(loss) and stats["tokens"] == 1.0
    assert torch.isfinite(Backend.model.bias.grad).all()
