"""Judge reply parsing and majority voting."""

import pytest

from rewards.votes import majority_vote, parse_score


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is right. Score: 1", 1),
        ("Score: -1", -1),
        ("score:0", 0),
        ("**Score**: -1", -1),
        ("Score: +1", 1),
        ("First I thought Score: 1 but on reflection Score: -1", -1),  # last occurrence wins
        ("Score: 7 ... Score: 1 ... Score: 9", 1),  # out-of-range ignored
        ("\\boxed{-1}", -1),  # fallback format
        ("\\boxed{1} and later \\boxed{0}", 0),
        ("\\boxed{1} but Score: -1", -1),  # Score: takes precedence over \boxed
        ("Score: 0.5", None),  # not an integer verdict
        ("", None),
        ("gibberish ÿ tokens <|im_end|>", None),
        ("\\boxed{5}", None),
    ],
)
def test_parse_score_formats(text, expected):
    assert parse_score(text) == expected


@pytest.mark.parametrize(
    "scores, expected",
    [
        ([1, 1, -1], 1),
        ([-1, -1, 1], -1),
        ([1, -1, 0], 0),  # three-way tie
        ([1, -1], 0),  # two-way tie
        ([1, -1, None], 0),  # tie among valid votes
        ([None, None, None], 0),  # all unparseable
        ([], 0),
        ([1, None, None], 1),  # unparseable votes abstain (MetaClaw)
        ([0, 0, 1], 0),
        ([1, 1, 0, 0, -1], 0),  # tie at the top
        ([1, 1, 1, 0, 0], 1),
    ],
)
def test_majority_vote_ties_and_invalid(scores, expected):
    assert majority_vote(scores) == expected


def test_mixed_formats_vote_together():
    replies = ["...Score: 1", "\\boxed{1}", "no verdict here"]
    assert majority_vote([parse_score(r) for r in replies]) == 1
