"""rewards/engine_judge.py: votes from the engine deployment's `chat`; outages are retryable LLMErrors;
the config resolves the judge source and refuses a learning profile without any reward source."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.serve.exceptions import BackPressureError

from core.config import ConfigError, RewardsConfig, config_from_dict
from core.llm import LLMError
from rewards.engine_judge import EngineJudge
from serve.local_handle import LocalHandle


class FakeEngine:
    def __init__(self, fail: Exception | None = None):
        self.bodies, self.fail = [], fail

    async def chat(self, body):
        self.bodies.append(body)
        if self.fail is not None:
            raise self.fail
        choices = [{"message": {"content": f"Score: {i}"}} for i in range(body["n"])]
        return SimpleNamespace(body={"choices": choices, "usage": {"prompt_tokens": 7, "completion_tokens": 3}})


def test_votes_come_from_the_base_model_on_the_engine():
    engine = FakeEngine()
    judge = EngineJudge("PolicyEngine", "clawray", "clawray-base", handle=LocalHandle(engine))
    texts = asyncio.run(judge.chat([{"role": "user", "content": "grade"}], temperature=0.6, max_tokens=16, n=2))
    assert texts == ["Score: 0", "Score: 1"]
    assert engine.bodies[0]["model"] == "clawray-base" and engine.bodies[0]["max_tokens"] == 16
    assert judge.usage.calls == 1 and judge.usage.prompt_tokens == 7 and judge.usage.completion_tokens == 3


def test_an_engine_outage_is_retryable_and_a_refusal_is_not():
    busy = EngineJudge("PolicyEngine", "clawray", "m", handle=LocalHandle(FakeEngine(BackPressureError(
        num_queued_requests=9, max_queued_requests=8))))
    with pytest.raises(LLMError) as e:
        asyncio.run(busy.chat([{"role": "user", "content": "x"}]))
    assert e.value.retryable and busy.usage.failures == 1
    refused = EngineJudge("PolicyEngine", "clawray", "m", handle=LocalHandle(FakeEngine(ValueError("too long"))))
    with pytest.raises(LLMError) as e:
        asyncio.run(refused.chat([{"role": "user", "content": "x"}]))
    assert not e.value.retryable and "too long" in str(e.value)


def test_judge_source_resolution():
    assert RewardsConfig().resolved_judge_source() == "engine"
    assert RewardsConfig(checkers=["lowercase"]).resolved_judge_source() == "none"
    ep = {"base_url": "http://127.0.0.1:1/v1", "model": "j"}
    assert RewardsConfig(judge=ep).resolved_judge_source() == "external"
    assert RewardsConfig(judge=ep, judge_source="engine").resolved_judge_source() == "engine"
    with pytest.raises(ValueError, match="judge is not set"):
        RewardsConfig(judge_source="external")


def test_a_learning_profile_without_a_reward_source_is_refused():
    with pytest.raises(ConfigError, match="no reward source"):
        config_from_dict({"rewards": {"judge_source": "none"}, "scheduler": {"mode": "rl"}})
    config_from_dict({"rewards": {"judge_source": "none"}, "scheduler": {"mode": "skills_only"}})  # fine
    config_from_dict({"rewards": {"judge_source": "none", "checkers": ["lowercase"]}})  # checkers: fine
