"""Re-sampled GRPO groups through the real system (issue 18 item 3; train/rollouts.py).

A user's turn with a programmatic check is served through the Proxy and scored into Replay. The window's
re-sampling phase (cluster/rollouts.py, exactly as the Controller runs it) then asks the real vLLM engine
for G responses to that exact prompt under a freshly published adapter, the real PRM grades each with the
turn's own check and stores the group whole, and a lease hands the group out whole. Checked: every
member answers the source's exact prompt ids, the adapter recorded is the active one, the engine's
logprobs are the sampled tokens' under that adapter (recomputed with HF + peft), the rewards are the
checker's, and the train step's advantages for the group are group-relative.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import httpx
import pytest
import ray
import torch

from tests.integration.helpers import publish_adapters, wait_for

pytestmark = pytest.mark.slow

ADMIN = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}
G = 6
ATOL = 1e-4  # nats per token, as tests/integration/test_invariant_logprobs.py


def test_a_window_resamples_a_fresh_prompt_into_a_whole_group(serve_app, openai_client):
    from ray import serve

    from cluster.rollouts import resample_groups
    from core import names
    from core.config import RolloutConfig
    from train.algos import compute_advantages

    cfg, h = serve_app["config"], serve_app["handles"]
    replay, root, base = h["Replay"], Path(cfg.storage_path()), serve_app["base_url"]
    (adapter,) = publish_adapters(cfg.model_path(), root / "adapters", 1)
    assert httpx.post(f"{base}/admin/adapters/{adapter}/activate", headers=ADMIN, timeout=120).status_code == 200
    tag = f"ro-{uuid.uuid4().hex[:8]}"
    # Fresh samples other tests left are parked under a lease of ours, so what follows sees only ours.
    park, _ = ray.get(replay.lease.remote(100_000, 3600.0, f"{tag}-park", 1))
    lease = None
    try:
        total = ray.get(replay.stats.remote())["total"]
        openai_client.chat.completions.create(
            model="clawray-policy", messages=[{"role": "user", "content": "Post a status line about the build."}],
            max_tokens=12, temperature=1.0, seed=3,
            extra_headers={"X-Session-Id": tag, "X-Session-Done": "true"},
            extra_body={"clawray_eval": {"type": "lowercase"}})
        assert wait_for(lambda: ray.get(replay.stats.remote())["total"] > total, 60, 0.3), "the turn was not scored"
        (src,) = ray.get(replay.rollout_candidates.remote(1))
        assert src.session_id == tag and src.eval_spec == {"type": "lowercase"}

        run_cfg = cfg.model_copy(deep=True)
        run_cfg.train.rollouts = RolloutConfig(group_size=G, max_prompts=1, max_tokens=10,
                                               keep_uniform_groups=True)  # a tiny model may answer alike
        engine = serve.get_deployment_handle(names.ENGINE, app_name=names.APP)
        prms = names.names_for(cfg).prms
        report = asyncio.run(resample_groups(run_cfg, replay=replay, engine=engine, prms=prms,
                                             prm=lambda n: ray.get_actor(n, namespace=cfg.ray.namespace)))
        assert (report.prompts, report.groups, report.samples, report.failed) == (1, 1, G, 0), report
        assert ray.get(replay.rollout_candidates.remote(5)) == []  # never re-sampled twice

        lease, leased = ray.get(replay.lease.remote(G + 1, 600.0, tag, 1))
        group = [s for s in leased if s.group_id == f"ro-{src.sample_id}"]
        assert len(leased) == G + 1 and len(group) == G  # the source and its whole group
        for s in group:
            assert s.prompt_ids == src.prompt_ids and s.rollout_of == src.sample_id and s.group_size == G
            assert s.adapter_version == adapter and s.skill_generation == src.skill_generation
            assert s.sampling.temperature == pytest.approx(1.0) and s.trainable
            assert s.reward == pytest.approx(lowercase_reward(s, cfg)) and s.reward_source == "checker:lowercase"
        _same_logprobs_as_the_adapter(cfg, root / "adapters" / adapter, group)
        rewards = torch.tensor([s.reward for s in group])
        adv = compute_advantages(rewards, [s.group_id for s in group])
        expected = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-6)
        torch.testing.assert_close(adv, expected)
    finally:
        for lid in (lease, park):
            if lid is not None:
                ray.get(replay.release.remote(lid))
        httpx.post(f"{base}/admin/adapters/base/activate", headers=ADMIN, timeout=60)


def lowercase_reward(sample, cfg) -> float:
    """The check's reward for the member's reply, from its own token ids (independently of the PRM)."""
    from transformers import AutoTokenizer

    from rewards.checkers import evaluate
    from rewards.scoring import checker_reward

    tok = AutoTokenizer.from_pretrained(cfg.model_path())
    text = tok.decode(sample.response_ids, skip_special_tokens=True)
    return checker_reward(evaluate({"type": "lowercase"}, text, None))


def _same_logprobs_as_the_adapter(cfg, adapter_dir: Path, samples) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from train.batch import collate
    from train.step import token_logprobs

    base = AutoModelForCausalLM.from_pretrained(cfg.model_path(), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    with torch.no_grad():
        learner = token_logprobs(model, collate(samples, [0.0] * len(samples)))
    for i, s in enumerate(samples):
        torch.testing.assert_close(torch.tensor(s.response_logprobs), learner[i, :len(s.response_ids)],
                                   atol=ATOL, rtol=0)
