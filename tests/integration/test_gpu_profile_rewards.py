"""configs/gpu.yaml's reward path on CPU: the GPU profile configures no external judge and no checkers,
so the served base model judges (rewards/engine_judge.py). Loaded with env overrides that swap in the tiny
model, its PRM scorer sends every vote to the suite's running engine deployment (real vLLM), never through
the Proxy (no judge call becomes a recorded turn)."""

from __future__ import annotations

import asyncio

import pytest

from cluster.system import engine_judge
from core.config import load_config
from core.contracts import Turn
from rewards.engine_judge import EngineJudge
from rewards.scorer import Scorer
from serve.sessions import DB_FILE, SessionStore
from tests.conftest import REPO

pytestmark = pytest.mark.slow

TINY = {  # what makes the GPU profile load on a CPU machine, and nothing about its rewards
    "CLAWRAY__MODEL__PATH": "tiny", "CLAWRAY__MODEL__DTYPE": "float32", "CLAWRAY__MODEL__MAX_MODEL_LEN": "2048",
    "CLAWRAY__ENGINE__DEVICE": "cpu", "CLAWRAY__ENGINE__NUM_GPUS": "0", "CLAWRAY__ENGINE__MAX_LORA_RANK": "16",
    "CLAWRAY__TRAIN__USE_GPU": "false", "CLAWRAY__TRAIN__BF16": "false",
    "CLAWRAY__TRAIN__LORA__RANK": "8", "CLAWRAY__TRAIN__LORA__ALPHA": "16",
}


def test_the_gpu_profile_is_judged_by_the_served_base_model(serve_app):
    cfg = load_config(REPO / "configs" / "gpu.yaml", env=TINY)
    assert cfg.rewards.judge is None and not cfg.rewards.checkers
    assert cfg.rewards.resolved_judge_source() == "engine"
    scorer = Scorer.from_config(cfg.rewards, tokenizer_path=cfg.model_path(), engine_judge=engine_judge(cfg))
    assert isinstance(scorer.judge, EngineJudge) and scorer.judge.model == cfg.model.served_name
    store = SessionStore(serve_app["config"].storage_path() / "sessions" / DB_FILE)
    turns_before = sum(v for k, v in store.stats().items() if k != "sessions")
    turn = Turn(session_id="gpu-profile-judge", turn_index=0, prompt_ids=[1, 2], response_ids=[3],
                response_logprobs=[-0.5], messages=[{"role": "user", "content": "What is 2 + 2?"}],
                response_text="4", next_state=[{"role": "user", "content": "thanks, correct"}])
    sample = asyncio.run(scorer.score(turn))
    assert sample is not None and len(sample.votes) == cfg.rewards.votes  # every vote came back
    assert scorer.judge.usage.calls == cfg.rewards.votes and scorer.judge.usage.failures == 0
    assert scorer.judge.usage.completion_tokens > 0  # the engine generated the judge's replies
    # The judge went to the engine, not through the Proxy: no turn was recorded for it.
    assert sum(v for k, v in store.stats().items() if k != "sessions") == turns_before
    store.close()
