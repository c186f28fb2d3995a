"""OPD against a real teacher: `vllm serve` of a local model with the policy's tokenizer (harness/teacher.py).

The unit tests script the teacher (tests/fake_judge.py); this one runs the nearest real thing: vLLM's own
OpenAI server on CPU. The Scorer checks the teacher's tokenizer through its `/tokenize` route (it must pass:
same tokenizer), then fetches the teacher's logprob of every sampled token with `/v1/completions` echo,
which must equal the teacher model's own log-softmax computed here with HF (temperature 1), and the
trainer's OPD term (train/algos.py) turns them into per-token advantages.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from core.config import RewardsConfig
from core.contracts import Turn
from core.llm import LLMClient
from harness.teacher import serve_teacher
from rewards.scorer import Scorer
from rewards.tokens import load_tokens
from tests.servers import free_port

pytestmark = pytest.mark.slow
ATOL = 1e-3  # nats: vLLM's CPU kernels vs HF eager fp32 (measured ~1e-6 on the policy engine)


def test_a_real_teacher_passes_the_tokenizer_check_and_its_logprobs_reach_the_sample(test_config, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.algos import opd_advantages

    model_path = test_config.model_path()
    tok = AutoTokenizer.from_pretrained(model_path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write the status line in lowercase."}],
                                     add_generation_prompt=True, tokenize=False)
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    response_ids = tok.encode("the build is green.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    turn = Turn(session_id="opd", turn_index=0, prompt_ids=prompt_ids, response_ids=response_ids,
                response_logprobs=[-1.0] * len(response_ids), response_text="the build is green.",
                messages=[{"role": "user", "content": "Write the status line in lowercase."}],
                eval_spec={"type": "lowercase"})
    with serve_teacher(model_path, free_port(), max_model_len=2048, log=tmp_path / "teacher.log") as endpoint:
        scorer = Scorer(RewardsConfig(checkers=["lowercase"], judge_source="none"), teacher=LLMClient(endpoint),
                        policy_tokens=load_tokens(model_path))
        sample = asyncio.run(scorer.score(turn))
    assert sample is not None and sample.trainable and sample.teacher_logprobs is not None
    assert len(sample.teacher_logprobs) == len(response_ids)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = hf(input_ids=ids).logits[0, len(prompt_ids) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(sample.teacher_logprobs), expected, atol=ATOL, rtol=0)
    # The trainer's per-token reverse KL to the teacher, from the engine's (here: -1.0) logprobs.
    old = torch.tensor([sample.response_logprobs])
    adv, rkl = opd_advantages(torch.tensor([0.0]), old, torch.tensor([sample.teacher_logprobs]),
                              torch.ones_like(old), weight=0.5)
    torch.testing.assert_close(adv[0], 0.5 * (expected - old[0]), atol=ATOL, rtol=0)
    assert rkl.shape == old.shape
