"""Re-sampled GRPO groups (train/rollouts.py, Replay's candidates, the PRM's group scoring)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.config import RewardsConfig, RolloutConfig
from core.contracts import Sample, Sampling, Turn
from rewards.prm import PRM
from rewards.scorer import Scorer
from serve.capture import Capture
from train import replay_store, rollouts
from train.replay_store import ReplayStore
from train.rollouts import completion_body, group_id_for, group_turns, run_rollouts

CFG = RolloutConfig(group_size=4, max_prompts=3, max_tokens=32)
LOWER = {"type": "lowercase"}


def source(sid: str = "s1", prompt: list[int] | None = None, gen: int = 0, **kw) -> Sample:
    return Sample(sample_id=sid, session_id=f"sess-{sid}", turn_index=2, tenant="ana/ws", reward=-1.0,
                  prompt_ids=prompt or [1, 2, 3], response_ids=[4], response_logprobs=[-0.5], loss_mask=[1],
                  skill_generation=gen, skills=["status-lowercase"], eval_spec=kw.pop("eval_spec", LOWER), **kw)


def capture(prompt: list[int], texts: list[str], adapter: str | None = "policy-v0002") -> Capture:
    cap = Capture(key="k", prompt_ids=list(prompt), adapter=adapter, sampling=Sampling(temperature=1.0))
    for i, t in enumerate(texts):
        c = cap.choice(i)
        c.token_ids, c.logprobs, c.text, c.finish_reason = [10 + i, 11], [-1.0, -2.0], t, "stop"
    return cap


class Reply:
    def __init__(self, cap):
        self.capture = cap


def test_the_engine_is_asked_for_the_exact_prompt_within_the_context():
    s = source(prompt=list(range(100)))
    body = completion_body(s, CFG, model="clawray-policy", max_model_len=120, seed=0)
    assert body["prompt"] == list(range(100)) and body["n"] == 4 and body["model"] == "clawray-policy"
    assert body["max_tokens"] == 20  # what the context leaves, below the configured 32
    assert body["seed"] == completion_body(s, CFG, model="m", max_model_len=120, seed=0)["seed"]
    assert body["seed"] != completion_body(s, CFG, model="m", max_model_len=120, seed=1)["seed"]
    assert completion_body(s, CFG, model="m", max_model_len=100, seed=0) is None


def test_a_groups_seed_is_the_turns_not_the_random_sample_id():
    """Sample ids are random (uuid4), so a seed drawn from one made every run of the same sessions sample
    other groups: `clawray bench`'s paired runs of `full` did not replay the same evening twice. The seed
    names the turn (session, index): the same turn draws the same group in every run and every retry."""
    a = completion_body(source("one"), CFG, model="m", max_model_len=120, seed=3)
    b = completion_body(source("two").model_copy(update={"session_id": "sess-one"}), CFG, model="m",
                        max_model_len=120, seed=3)
    assert a["seed"] == b["seed"]
    later = source("one").model_copy(update={"turn_index": 3})
    assert completion_body(later, CFG, model="m", max_model_len=120, seed=3)["seed"] != a["seed"]


def test_group_members_are_turns_of_the_source_prompt_with_what_the_engine_sampled():
    s = source()
    turns = group_turns(s, capture([1, 2, 3], ["a", "B", "c", "d"]), 4)
    gid = group_id_for(s)
    assert gid == replay_store.ROLLOUT_PREFIX + "s1"
    assert [t.turn_id for t in turns] == [f"{gid}-{i}" for i in range(4)]
    assert {t.group_id for t in turns} == {gid} and {t.group_size for t in turns} == {4}
    t = turns[1]
    assert (t.prompt_ids, t.response_ids, t.response_logprobs, t.response_text) == ([1, 2, 3], [11, 11],
                                                                                      [-1.0, -2.0], "B")
    assert t.adapter_version == "policy-v0002" and t.skill_generation == 0 and t.skills == ["status-lowercase"]
    assert t.eval_spec == LOWER and t.next_state is None and t.tenant == "ana/ws"
    with pytest.raises(ValueError, match="another prompt"):
        group_turns(s, capture([1, 2, 9], ["a"] * 4), 4)
    with pytest.raises(ValueError, match="3 responses"):
        group_turns(s, capture([1, 2, 3], ["a"] * 3), 4)


def test_a_run_stores_graded_groups_and_counts_what_it_dropped():
    sources = [source("ok", [1]), source("same", [2]), source("files", [3]), source("down", [4])]
    outcome = {"ok": {"stored": 4, "rewards": [1, -1, -1, 1], "why": "stored"},
               "same": {"stored": 0, "rewards": [1, 1, 1, 1], "why": "uniform"},
               "files": {"stored": 0, "rewards": [], "why": "ungradable"}}
    asked: list[int] = []

    async def candidates(n):
        asked.append(n)
        return sources

    async def complete(body):
        return Reply(capture(body["prompt"], ["x"] * body["n"]))

    async def score_group(turns, source_id, keep):
        assert keep is False and len(turns) == 4
        if source_id == "down":
            raise RuntimeError("PRM restarting")
        return outcome[source_id]

    r = asyncio.run(run_rollouts(CFG, candidates, complete, score_group, model="m", max_model_len=64))
    assert asked == [3]
    assert (r.prompts, r.groups, r.samples, r.uniform, r.ungradable, r.failed) == (4, 1, 4, 1, 1, 1)
    assert r.rewards == [[1.0, -1.0, -1.0, 1.0]]


def test_rollouts_off_touch_nothing():
    async def boom(*_a):
        raise AssertionError("called")

    r = asyncio.run(run_rollouts(RolloutConfig(group_size=1), boom, boom, boom, model="m", max_model_len=64))
    assert r.prompts == 0


def test_candidates_are_fresh_loose_current_generation_prompts_newest_first_never_resampled_twice(
        tmp_path: Path, state_cfg):
    store = ReplayStore(tmp_path / "replay.sqlite", state=state_cfg)
    try:
        store.append([source("old", [1], gen=0), source("a", [2], gen=1), source("dup", [2], gen=1),
                      source("b", [3], gen=1),
                      source("grouped", [4], gen=1, group_id="g", group_size=1),
                      source("masked", [5], gen=1).model_copy(update={"loss_mask": [0]})])
        assert store.generation == 1  # "old" retired
        got = [s.sample_id for s in store.rollout_candidates(10)]
        assert got == ["b", "dup"]  # newest first; one per prompt; no group members; nothing masked
        assert [s.sample_id for s in store.rollout_candidates(1)] == ["b"]
        # A stored group answers "b": it is not offered again.
        members = [source(f"ro-b-{i}", [3], gen=1, group_id="ro-b", group_size=2, rollout_of="b")
                   for i in range(2)]
        store.append(members)
        assert [s.sample_id for s in store.rollout_candidates(10)] == ["dup"]
    finally:
        store.close()


def test_a_member_is_graded_on_its_reply_alone_and_trained_whatever_its_reward():
    scorer = Scorer(RewardsConfig(checkers=["lowercase", "file_check"], judge_source="none"))
    turn = Turn(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2, 3], response_logprobs=[-1.0, -1.0],
                response_text="ALL DONE", eval_spec=LOWER, group_id="ro-x", group_size=2, turn_id="ro-x-0")
    sample = asyncio.run(scorer.score_rollout(turn))
    assert sample.reward == -1.0 and sample.loss_mask == [1, 1] and sample.sample_id == "ro-x-0"
    assert sample.reward_source == "checker:lowercase" and sample.group_id == "ro-x"
    files = turn.model_copy(update={"eval_spec": {"type": "file_check", "command": "python c.py a.json",
                                                  "expect_exit": 0}})
    assert asyncio.run(scorer.score_rollout(files)) is None  # the user's files are not this reply's
    nothing = turn.model_copy(update={"eval_spec": None})
    assert asyncio.run(scorer.score_rollout(nothing)) is None  # no check, no judge


class ListSink:
    def __init__(self):
        self.calls: list[list[Sample]] = []

    async def append(self, samples):
        self.calls.append(list(samples))
        return len(samples)


def _group(texts: list[str]) -> list[Turn]:
    return [Turn(turn_id=f"ro-src-{i}", session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2],
                 response_logprobs=[-1.0], response_text=t, eval_spec=LOWER, group_id="ro-src",
                 group_size=len(texts)) for i, t in enumerate(texts)]


def test_the_prm_stores_a_group_whole_or_not_at_all():
    sink = ListSink()
    prm = PRM(RewardsConfig(checkers=["lowercase"], judge_source="none"), lambda: sink)
    out = asyncio.run(prm.score_group(_group(["ok", "NO", "fine"]), "src"))
    assert out == {"stored": 3, "rewards": [1.0, -1.0, 1.0], "why": "stored"}
    (stored,) = sink.calls
    assert [s.sample_id for s in stored] == ["ro-src-0", "ro-src-1", "ro-src-2"]
    assert {s.rollout_of for s in stored} == {"src"} and all(s.trainable for s in stored)
    assert asyncio.run(prm.score_group(_group(["ok", "yes"]), "src"))["why"] == "uniform"
    assert len(sink.calls) == 1
    assert asyncio.run(prm.score_group(_group(["ok", "yes"]), "src", True))["why"] == "stored"
    assert prm.counts["rollout_uniform"] == 1


def test_the_module_uses_the_stores_group_prefix():
    assert rollouts.ROLLOUT_PREFIX is replay_store.ROLLOUT_PREFIX
