"""Reward decisions and loss-mask rules (turn + checker result and/or votes -> Sample)."""

import pytest

from core.contracts import Turn, TurnType
from rewards.checkers import CheckResult
from rewards.scoring import SessionRule, build_sample, checker_reward, decide_reward, make_vote


def turn(i=0, *, next_state=True, last=False, sid="s1", **kw):
    return Turn(session_id=sid, turn_index=i, prompt_ids=[1], response_ids=[5, 6, 7],
                response_logprobs=[-1.0, -2.0, -3.0],
                next_state=[{"role": "user", "content": "thanks"}] if next_state else None,
                last_in_session=last, **kw)


def votes(*scores):
    return [make_vote(f"... Score: {s}" if s is not None else "gibberish", s) for s in scores]


PASS, FAIL = CheckResult(1.0, True, "ok", "backup"), CheckResult(0.0, False, "no .bak", "backup")


@pytest.mark.parametrize("credit, reward", [(1.0, 1.0), (0.0, -1.0), (0.5, 0.0), (5 / 6, 2 / 3)])
def test_checker_credit_maps_to_reward(credit, reward):
    assert checker_reward(CheckResult(credit, credit == 1, "", "x")) == pytest.approx(reward)


def test_decide_reward_sources():
    assert decide_reward(PASS, []) == (1.0, "checker:backup")
    assert decide_reward(FAIL, votes(1, 1, 1)) == (-1.0, "checker:backup+judge")  # checker decides
    assert decide_reward(None, votes(1, 1, -1)) == (1.0, "judge")
    assert decide_reward(None, []) == (0.0, "none")


def test_judge_sample_keeps_votes_and_is_trainable_with_next_state():
    s = build_sample(turn(), None, votes(1, 1, None))
    assert s.reward == 1 and s.trainable and s.loss_mask == [1, 1, 1]
    assert [v.score for v in s.votes] == [1, 1, None] and s.votes[2].text == "gibberish"
    assert s.reward_source == "judge" and s.sample_id == s.turn_id


def test_unparseable_votes_give_zero_masked_but_recorded():
    s = build_sample(turn(), None, votes(None, None, None))
    assert s.reward == 0 and not s.trainable and s.loss_mask == [0, 0, 0]
    assert len(s.votes) == 3


def test_tie_gives_zero_masked():
    s = build_sample(turn(), None, votes(1, -1, 0))
    assert s.reward == 0 and not s.trainable


def test_no_next_state_masks_judge_samples_but_not_checker_samples():
    judged = build_sample(turn(next_state=False), None, votes(-1, -1, -1))
    assert judged.reward == -1 and not judged.trainable
    checked = build_sample(turn(next_state=False), FAIL, [])
    assert checked.reward == -1 and checked.trainable


def test_side_turns_never_become_samples():
    assert build_sample(turn(turn_type=TurnType.side), PASS, votes(1)) is None


def test_session_rule_forces_last_nonzero_turn_when_nothing_was_trainable():
    rule = SessionRule(enabled=True)
    first = build_sample(turn(0), None, votes(0, 0, 0), rule)  # reward 0: masked
    last = build_sample(turn(1, next_state=False, last=True), None, votes(1, 1, 1), rule)
    assert not first.trainable
    assert last.trainable and last.reward == 1  # forced: the session had no trainable sample


def test_session_rule_does_not_force_when_session_already_trained():
    rule = SessionRule(enabled=True)
    assert build_sample(turn(0), None, votes(1, 1, 1), rule).trainable
    last = build_sample(turn(1, next_state=False, last=True), None, votes(1, 1, 1), rule)
    assert not last.trainable


def test_session_rule_never_forces_a_zero_reward():
    rule = SessionRule(enabled=True)
    last = build_sample(turn(0, next_state=False, last=True), None, votes(None, None, None), rule)
    assert not last.trainable


def test_session_rule_off():
    rule = SessionRule(enabled=False)
    last = build_sample(turn(0, next_state=False, last=True), None, votes(1, 1, 1), rule)
    assert not last.trainable


def test_session_rule_is_per_session_and_bounded():
    rule = SessionRule(enabled=True, max_sessions=2)
    build_sample(turn(0, sid="a"), None, votes(1, 1, 1), rule)  # a has a trainable sample
    build_sample(turn(0, sid="b"), None, votes(0), rule)
    last_b = build_sample(turn(1, sid="b", next_state=False, last=True), None, votes(-1), rule)
    assert last_b.trainable  # b had none, a's does not count
    for sid in ("c", "d", "e"):
        build_sample(turn(0, sid=sid), None, votes(0), rule)
    assert len(rule._has_trainable) <= 2
