"""Issue 12 item 9: replies cut by `max_tokens` (finish_reason "length") are marked and handled by ONE rule
(rewards/scoring.py): scored and trained as they are, with the judge told the reply was cut off; the mark
travels from the turn to the sample (and so to the replay buffer)."""

from __future__ import annotations

from core.contracts import Sample, Turn
from rewards.checkers import CheckResult
from rewards.judge import build_judge_messages
from rewards.scoring import build_sample, make_vote
from rewards.tokens import WhitespaceTokens


def _turn(finish_reason: str) -> Turn:
    return Turn(session_id="s", turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4, 5],
                response_logprobs=[-0.1, -0.2, -0.3], finish_reason=finish_reason,
                messages=[{"role": "user", "content": "List every prime below 100"}],
                response_text="2, 3, 5, 7, 11, 13",
                next_state=[{"role": "user", "content": "you stopped halfway"}])


def test_a_reply_cut_by_max_tokens_is_marked_on_the_turn_and_its_sample():
    cut, whole = _turn("length"), _turn("stop")
    assert cut.truncated and not whole.truncated
    sample = build_sample(cut, None, [make_vote("Score: -1", -1)])
    assert sample is not None and sample.truncated
    assert not build_sample(whole, None, [make_vote("Score: 1", 1)]).truncated
    assert Sample.model_validate_json(sample.model_dump_json()).truncated  # durable in the replay store


def test_a_cut_reply_is_scored_and_trained_as_it_is():
    cut = _turn("length")
    judged = build_sample(cut, None, [make_vote("Score: -1", -1)] * 3)
    assert judged.reward == -1.0 and judged.loss_mask == [1, 1, 1]
    checked = build_sample(cut, CheckResult(score=1.0, passed=True, reason="all primes", checker="multi_choice"), [])
    assert checked.reward == 1.0 and checked.loss_mask == [1, 1, 1]


def test_the_judge_is_told_the_reply_was_cut_off():
    _, cut = build_judge_messages(_turn("length"), tokens=WhitespaceTokens(), budget=1000)
    _, whole = build_judge_messages(_turn("stop"), tokens=WhitespaceTokens(), budget=1000)
    assert "max_tokens" in cut["content"] and "cut off" in cut["content"]
    assert "cut off" not in whole["content"]
    # The note survives a budget too small for the response itself.
    _, tiny = build_judge_messages(_turn("length"), tokens=WhitespaceTokens(), budget=8)
    assert "cut off" in tiny["content"]
