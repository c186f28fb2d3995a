"""GRPO groups are whole (issue 12 item 5): responses sampled for one prompt are leased together, never
split across steps, leasable only once every member arrived; zero-reward members count in the group's
mean and std; one rule for broken groups (a support, dead or stale member: never leased, retired at the
next bump); advantages dispatched through the `ADVANTAGES` registry."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from core.contracts import Sample, TurnType
from serve.capture import Capture, ChoiceCapture
from serve.protocol import Reply
from serve.turns import TurnMeta, turns_from_reply
from train import algos
from train.grpo import split_poison
from train.replay_store import ReplayStore


def member(group: str | None, size: int, reward: float = 1.0, gen: int = 0, mask=None, **kw) -> Sample:
    mask = [1, 1] if mask is None else mask
    return Sample(session_id="s", turn_index=0, prompt_ids=[1, 2], response_ids=kw.pop("response", [3, 4]),
                  response_logprobs=[-1.0, -1.0], reward=reward, loss_mask=mask, skill_generation=gen,
                  group_id=group, group_size=size, **kw)


def group(size: int, rewards=None, **kw) -> list[Sample]:
    gid = uuid.uuid4().hex
    rewards = rewards or [1.0, -1.0] * size
    return [member(gid, size, reward=rewards[i], **kw) for i in range(size)]


@pytest.fixture()
def store(tmp_path: Path, state_cfg) -> ReplayStore:
    """On both backends (SQLite, and a fresh namespace in a real PostgreSQL server)."""
    s = ReplayStore(tmp_path / "replay.sqlite", default_lease_s=60, state=state_cfg)
    yield s
    s.close()


def ids(samples) -> set[str]:
    return {s.sample_id for s in samples}


def test_a_group_is_leasable_only_once_every_member_arrived(store: ReplayStore) -> None:
    g = group(3)
    store.append(g[:2])
    assert store.lease(10) == (None, [])  # two of three: wait
    store.append(g[2:])
    _, got = store.lease(10)
    assert ids(got) == ids(g)


def test_a_group_never_splits_across_leases(store: ReplayStore) -> None:
    a, loose, b = group(3), member(None, 1), group(3)
    store.append(a + [loose] + b)
    l1, first = store.lease(4)
    assert ids(first) == ids(a) | {loose.sample_id}  # b does not fit beside them: it waits whole
    l2, second = store.lease(4)
    assert ids(second) == ids(b)


def test_a_group_larger_than_the_batch_is_leased_alone(store: ReplayStore) -> None:
    big, loose = group(5), member(None, 1)
    store.append(big + [loose])
    _, first = store.lease(2)
    assert ids(first) == ids(big)
    _, second = store.lease(2)
    assert ids(second) == {loose.sample_id}


def test_zero_reward_members_are_leased_with_their_group_and_count_in_its_mean_and_std(store: ReplayStore) -> None:
    torch.manual_seed(0)
    rewards = torch.randn(4).tolist()
    rewards[1] = 0.0
    g = group(4, rewards=rewards)
    g[1] = g[1].model_copy(update={"loss_mask": [0, 0]})  # reward 0: nothing to train in its tokens
    store.append(g)
    assert store.states([g[1].sample_id]) == {g[1].sample_id: "fresh"}  # not `masked`: the group needs it
    _, got = store.lease(4)
    assert ids(got) == ids(g)
    adv = algos.compute_advantages(torch.tensor([s.reward for s in got]), [s.group_id for s in got])
    r = torch.tensor([s.reward for s in got])
    want = (r - r.mean()) / (r.std(unbiased=False) + algos.EPS)
    torch.testing.assert_close(adv, want)


def test_a_group_without_any_trainable_member_is_masked(store: ReplayStore) -> None:
    g = group(2, mask=[0, 0])
    store.append(g)
    assert store.lease(10) == (None, [])
    assert set(store.states(list(ids(g))).values()) == {"masked"}


def test_a_group_with_a_support_member_is_never_leased_and_retires_at_the_bump(store: ReplayStore) -> None:
    g, loose = group(3), member(None, 1)
    store.append(g + [loose])
    token, claimed = store.begin_evolution([g[0].sample_id], ttl_s=60)
    store.end_evolution(token, None, [])  # the claim stays support (an evolution used it)
    _, got = store.lease(10)
    assert ids(got) == {loose.sample_id}
    store.set_generation(1)
    assert store.states([g[1].sample_id, g[2].sample_id]) == {g[1].sample_id: "retired", g[2].sample_id: "retired"}


def test_a_group_with_a_released_support_member_is_whole_again(store: ReplayStore) -> None:
    g = group(2)
    store.append(g)
    token, claimed = store.begin_evolution([g[0].sample_id], ttl_s=60)
    assert store.lease(10) == (None, [])
    store.end_evolution(token, None, claimed)  # nothing changed: handed back
    _, got = store.lease(10)
    assert ids(got) == ids(g)


def test_a_group_with_members_of_another_generation_is_never_leased(store: ReplayStore) -> None:
    g = group(2)
    store.append([g[0]])
    store.set_generation(1)  # the first member is retired; the second arrives stale too
    store.append([g[1]])
    assert store.lease(10) == (None, [])
    assert set(store.states(list(ids(g))).values()) == {"retired"}


def test_a_poison_member_takes_its_whole_group_out_of_the_step() -> None:
    g, loose = group(3), member(None, 1)
    g[1] = g[1].model_copy(update={"response_ids": [3, 99_999]})  # outside the vocabulary
    usable, bad = split_poison(g + [loose], vocab_size=4096)
    assert ids(usable) == {loose.sample_id} and set(bad) == {g[1].sample_id}
    assert "vocabulary" in bad[g[1].sample_id]
    empty = Sample(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[], response_logprobs=[],
                   reward=1.0, loss_mask=[], skill_generation=0)
    assert "non-empty" in split_poison([empty], 4096)[1][empty.sample_id]


def test_advantages_are_dispatched_through_the_registry(monkeypatch) -> None:
    calls = []

    def spy(name):
        fn = algos.ADVANTAGES[name]

        def wrapped(*a, **kw):
            calls.append(name)
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setitem(algos.ADVANTAGES, "grpo_group", spy("grpo_group"))
    monkeypatch.setitem(algos.ADVANTAGES, "batch_norm", spy("batch_norm"))
    algos.compute_advantages(torch.tensor([1.0, 0.0, 1.0, -1.0]), ["g", "g", None, None])
    assert sorted(calls) == ["batch_norm", "grpo_group"]
    with pytest.raises(ValueError, match="valid names"):
        algos.compute_advantages(torch.tensor([1.0]), ["g"], grouped="nope")


def test_turns_of_one_reply_carry_the_group_size() -> None:
    cap = Capture(key="k", prompt_ids=[1, 2],
                  choices={i: ChoiceCapture(index=i, token_ids=[3 + i], logprobs=[-1.0]) for i in range(3)})
    meta = TurnMeta(session_id="s", turn_type=TurnType.main, session_done=False, tenant="default",
                    eval_spec=None, derived=False)
    turns = turns_from_reply(Reply(body={}, capture=cap, messages=[]), meta, [], 0, [])
    assert [t.group_size for t in turns] == [3, 3, 3] and len({t.group_id for t in turns}) == 1
    sample = Sample.from_turn(turns[0], reward=1.0, trainable=True)
    assert sample.group_size == 3 and sample.group_id == turns[0].group_id
