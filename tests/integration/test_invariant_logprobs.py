"""Issue 12 item 6: behaviour logprobs are the sampling distribution's, and the trainer recomputes them.

Turns are served through the real stack (Proxy -> PolicyEngine with vLLM on CPU) under a published LoRA
adapter: OpenAI with n=2, a non-default temperature and a top_p; Anthropic with a temperature and a top_k;
an OpenAI stream with the server's default sampling, cut by max_tokens. For every captured token:

- the engine's logprob is the token's logprob under the distribution it was sampled from (logits /
  temperature, then top-k, then top-p), computed here independently from the HF + peft model, and NOT
  the raw (temperature 1) logprob whenever the temperature differs from 1;
- train/step.py's `token_logprobs` on the turn's Sample (same adapter, fp32 on CPU) gives the same value.

Tolerance: |engine - recomputed| <= ATOL = 1e-4 nats per token. vLLM's CPU kernels (attention, LoRA)
and HF's eager fp32 kernels sum in different orders: measured here, the largest gap was 1e-6 nats;
ATOL leaves 100x headroom for other CPUs while staying far below what the processing changes (the raw
logprobs differ by 0.17 to 4.9 nats on these turns).
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import torch

from tests.integration.helpers import publish_adapters, session_turns, wait_for

pytestmark = pytest.mark.slow

ADMIN = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}
ATOL = 1e-4  # nats per token (see the module docstring)
PROMPT = [{"role": "user", "content": "List three colours and say why you like them."}]


def _sid() -> str:
    return f"lp-{uuid.uuid4().hex[:8]}"


def _turns(root: Path, sid: str, want: int) -> list:
    found = wait_for(lambda: len(t := session_turns(root, sid)) >= want and t, 30, 0.2)
    assert found, f"{want} turn(s) of {sid} were not stored"
    return found


def _reference(model, turn, temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, raw) logprobs of the turn's sampled ids, computed directly (no clawray code)."""
    ids = torch.tensor([turn.prompt_ids + turn.response_ids])
    p = len(turn.prompt_ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, p - 1:-1].float()  # (R, V): position p-1+j predicts token j
    target = torch.tensor(turn.response_ids)[:, None]
    raw = torch.log_softmax(logits, -1).gather(-1, target)[:, 0]
    x = logits / (temperature if temperature >= 1e-5 else 1.0)
    if 0 < top_k < x.shape[-1]:
        x = x.masked_fill(x < x.topk(top_k, -1).values[:, -1:], -math.inf)
    if top_p < 1.0:
        srt, idx = x.sort(-1)
        drop = srt.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False
        x = x.scatter(-1, idx, srt.masked_fill(drop, -math.inf))
    return torch.log_softmax(x, -1).gather(-1, target)[:, 0], raw


@pytest.fixture(scope="module")
def served(serve_app):
    """Serve the turns under a freshly published adapter; yield (turns with their requested sampling, adapter)."""
    cfg = serve_app["config"]
    root, base = Path(cfg.storage_path()), serve_app["base_url"]
    (name,) = publish_adapters(cfg.model_path(), root / "adapters", 1)
    assert httpx.post(f"{base}/admin/adapters/{name}/activate", headers=ADMIN, timeout=120).status_code == 200
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    cases = []

    sid = _sid()  # OpenAI, n=2 (a GRPO group), temperature and top_p, seeded so the draw is reproducible
    client.chat.completions.create(model="clawray-policy", messages=PROMPT, n=2, temperature=0.7, top_p=0.9,
                                   seed=11, max_tokens=12, extra_headers={"X-Session-Id": sid})
    cases += [(t, (0.7, 0, 0.9)) for t in _turns(root, sid, 2)]

    sid = _sid()  # Anthropic, temperature and top_k
    claude.messages.create(model="clawray-policy", max_tokens=12, messages=PROMPT, extra_headers={"X-Session-Id": sid},
                           extra_body={"temperature": 0.5, "top_k": 20})  # this SDK has no sampling kwargs
    cases += [(t, (0.5, 20, 1.0)) for t in _turns(root, sid, 1)]

    sid = _sid()  # OpenAI stream, the server's default sampling, cut by max_tokens
    stream = client.chat.completions.create(model="clawray-policy", messages=PROMPT, max_tokens=5, stream=True,
                                            extra_headers={"X-Session-Id": sid})
    finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
    (turn,) = _turns(root, sid, 1)
    cases.append((turn, None))
    yield cases, name, finish[-1], root / "adapters" / name
    httpx.post(f"{base}/admin/adapters/base/activate", headers=ADMIN, timeout=60)


@pytest.fixture(scope="module")
def peft_model(served, serve_app):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(serve_app["config"].model_path(), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(served[3])).eval()


def test_engine_logprobs_are_the_sampling_distributions_not_the_raw_ones(served, peft_model):
    cases, name, _, _ = served
    assert len(cases) == 4
    for turn, requested in cases:
        assert turn.adapter_version == name and turn.response_ids
        if requested is None:
            continue  # the server's default: checked against the turn's own record below
        processed, raw = _reference(peft_model, turn, *requested)
        engine = torch.tensor(turn.response_logprobs)
        assert torch.isfinite(processed).all(), "a sampled token lies outside its own top-k/top-p set"
        torch.testing.assert_close(engine, processed, atol=ATOL, rtol=0)
        assert (engine - raw).abs().max() > 50 * ATOL, "the engine recorded the raw logprobs"


def test_turns_keep_their_sampling_and_the_trainer_recomputes_the_engines_logprobs(served, peft_model):
    from core.contracts import Sample
    from train.batch import collate
    from train.step import token_logprobs

    cases, _, finish, _ = served
    for turn, requested in cases:
        if requested is not None:
            got = (turn.sampling.temperature, turn.sampling.top_k, turn.sampling.top_p)
            assert got == pytest.approx(requested), (got, requested)
        sample = Sample.from_turn(turn, reward=1.0, trainable=True)
        assert sample.sampling == turn.sampling
        with torch.no_grad():
            learner = token_logprobs(peft_model, collate([sample], [0.0]))[0]
        torch.testing.assert_close(torch.tensor(turn.response_logprobs), learner, atol=ATOL, rtol=0)
    cut = cases[-1][0]
    assert cut.finish_reason == finish and cut.truncated == (finish == "length")
    assert Sample.from_turn(cut, reward=1.0, trainable=True).truncated == cut.truncated
