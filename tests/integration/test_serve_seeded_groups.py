"""A seeded group whose prompts the engine cannot prefill in one step (vLLM on CPU).

A re-sampled GRPO group (train/rollouts.py) asks the engine for G responses to one prompt with a seed.
vLLM schedules the G children's prefills under a token budget; a child whose prefill is cut by the budget
has its sampled token discarded, and vLLM then rewinds that child's seeded generator, which a CPU
generator cannot do ("CPU Generator does not use offset"): the engine core died and every request after
it failed (seen in `clawray bench`'s `full` runs: the second evening's groups all failed with
EngineDeadError). clawray runs vLLM on CPU without chunked prefill (serve/vllm_engine.py), so no prefill
is cut. Seen failing first: the group below killed the suite's engine.
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.slow


def test_a_seeded_group_longer_than_the_token_budget_is_served_and_the_engine_lives(serve_app):
    from ray import serve

    from core import names

    cfg = serve_app["config"]
    engine = serve.get_deployment_handle(names.ENGINE, app_name=names.APP)
    # Two groups at once, as a window re-samples them (train/rollouts.py, concurrency 2): 2 × 16 × 600
    # prompt tokens, several steps' budget, so some child's prefill is cut.
    prompts = [[(7 * i + k) % 200 + 20 for i in range(600)] for k in (0, 1)]
    bodies = [{"model": cfg.model.policy_alias, "prompt": p, "n": 16, "seed": 11 + k, "temperature": 1.0,
               "max_tokens": 3} for k, p in enumerate(prompts)]

    async def ask(bs):
        return await asyncio.gather(*(engine.complete.remote(b) for b in bs))

    for reply, p in zip(asyncio.run(ask(bodies)), prompts, strict=True):
        assert len(reply.capture.choices) == 16 and list(reply.capture.prompt_ids) == p
    (again,) = asyncio.run(ask([{**bodies[0], "seed": 21}]))  # the engine still serves
    assert len(again.capture.choices) == 16 and all(c.token_ids for c in again.capture.choices.values())
