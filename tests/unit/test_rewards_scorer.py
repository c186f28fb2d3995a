"""Scorer (the PRM's logic without Ray) against a scripted judge/teacher server."""

import pytest

from core.config import ConfigError, LLMEndpoint, RewardsConfig
from core.contracts import Turn, TurnType
from core.llm import LLMClient
from rewards.errors import JudgeUnavailable
from rewards.scorer import Scorer
from tests.fake_judge import FakeJudge, Script

MC = {"type": "multi_choice", "options": {"A": "x", "B": "y", "C": "z"}, "answer": ["A"]}


class WordTokens:
    """A stand-in policy tokenizer: one id per word (its length)."""

    def encode(self, text):
        return [len(w) for w in text.split()]


@pytest.fixture
def server():
    with FakeJudge(Script(replies=["Looks right. Score: 1"])) as s:
        yield s


def ep(url, **kw):
    return LLMEndpoint(base_url=url, model="m", timeout_s=5, max_retries=1, backoff_s=0.01, **kw)


def turn(**kw):
    base = dict(session_id="s", turn_index=0, prompt_ids=[1, 2, 3], response_ids=[4, 5],
                response_logprobs=[-0.5, -0.6], response_text="\\bbox{A}",
                messages=[{"role": "user", "content": "pick"}],
                next_state=[{"role": "user", "content": "[Previous Feedback] correct"}])
    return Turn(**{**base, **kw})


def scorer(url=None, teacher_url=None, **cfg):
    c = RewardsConfig(**cfg)
    return Scorer(c, judge=LLMClient(ep(url)) if url else None,
                  teacher=LLMClient(ep(teacher_url)) if teacher_url else None,
                  policy_tokens=WordTokens() if teacher_url else None)


async def test_judge_votes_become_a_sample(server):
    s = await scorer(server.base_url, votes=3).score(turn())
    assert s.reward == 1 and s.trainable and s.reward_source == "judge"
    assert [v.score for v in s.votes] == [1, 1, 1]
    assert len([r for r in server.script.requests if r["path"] == "/v1/chat/completions"]) == 3
    assert "[Previous Feedback] correct" in server.script.requests[0]["body"]["messages"][1]["content"]


async def test_gibberish_judge_gives_zero_with_votes_recorded(server):
    server.script.replies = ["ĠĠ<|im_end|> tok tok", "", "Score: banana"]
    s = await scorer(server.base_url, votes=3).score(turn())
    assert s.reward == 0 and not s.trainable
    assert [v.score for v in s.votes] == [None, None, None]
    # The three votes run concurrently and the fake judge hands its scripted replies out in arrival order,
    # so which vote got which reply is up to the event loop: the texts are compared as a multiset.
    assert sorted(v.text for v in s.votes) == sorted(["ĠĠ<|im_end|> tok tok", "", "Score: banana"])


async def test_dead_judge_raises_retryable_error(server):
    server.script.fail_status = 503
    with pytest.raises(JudgeUnavailable) as e:
        await scorer(server.base_url).score(turn())
    assert e.value.retryable and "503" in str(e.value)


async def test_checker_decides_and_judge_votes_are_kept(server):
    server.script.replies = ["Score: -1"]
    s = await scorer(server.base_url, checkers=["multi_choice"]).score(turn(eval_spec=MC))
    assert s.reward == 1 and s.reward_source == "checker:multi_choice+judge"
    assert [v.score for v in s.votes] == [-1, -1, -1]


async def test_checkers_only_without_judge():
    s = await scorer(checkers=["multi_choice"]).score(turn(eval_spec=MC, response_text="\\bbox{B}"))
    assert s.reward == pytest.approx(2 * (1 - 2 / 3) - 1) and s.reward_source == "checker:multi_choice"
    none = await scorer(checkers=[]).score(turn(eval_spec=MC))  # checker not enabled, no judge
    assert none.reward == 0 and none.reward_source == "none" and not none.trainable


async def test_unusable_eval_spec_falls_back_to_judge(server):
    s = await scorer(server.base_url, checkers=["multi_choice"]).score(turn(eval_spec={"type": "nope"}))
    assert s.reward_source == "judge" and s.reward == 1


async def test_side_turn_is_not_scored(server):
    assert await scorer(server.base_url).score(turn(turn_type=TurnType.side)) is None
    assert server.script.requests == []


async def test_opd_teacher_logprobs_with_verified_tokenizer(server):
    server.script.tokenize = WordTokens().encode
    server.script.logprob = lambda i, tok: -float(i)
    s = await scorer(server.base_url, teacher_url=server.base_url).score(turn())
    assert s.teacher_logprobs == [-3.0, -4.0]  # response positions 3, 4


async def test_opd_refuses_a_teacher_with_another_tokenizer(server):
    server.script.tokenize = lambda text: [ord(c) for c in text]
    with pytest.raises(ConfigError, match="same tokenizer|policy's tokenizer"):
        await scorer(server.base_url, teacher_url=server.base_url).score(turn())


async def test_opd_refuses_a_teacher_it_cannot_check(server):
    with pytest.raises(ConfigError, match="/tokenize"):
        await scorer(server.base_url, teacher_url=server.base_url).check_teacher()


def test_opd_needs_the_policy_tokenizer():
    with pytest.raises(ConfigError, match="tokenizer"):
        Scorer(RewardsConfig(), teacher=LLMClient(ep("http://127.0.0.1:1/v1")))


async def test_grade_a_replayed_reply_without_a_next_state(server):
    """What the validation gate asks of the PRM (evolve/gate.py): the reply alone graded in [0, 1]."""
    s = scorer(server.base_url, votes=3, checkers=["multi_choice", "file_check"])
    msgs = [{"role": "user", "content": "pick"}]
    assert await s.grade(msgs, "\\bbox{A}", {**MC, "workspace": "alice"}) == 1.0
    assert await s.grade(msgs, "\\bbox{B}", MC) == pytest.approx(1 / 3)  # 1 - (1 wrong + 1 missed) / 3 options
    # A check that reads the workspace would grade the original session's files, not this reply.
    assert await s.grade(msgs, "done", {"type": "file_check", "path": "a.txt", "workspace": "alice"}) is None
    assert not server.script.requests  # checks decided: no judge call
    assert await s.grade(msgs, "ok", None) == 1.0  # no check sent: the judge's majority, Score: 1 -> 1.0
    assert "[Previous Feedback]" not in server.script.requests[0]["body"]["messages"][1]["content"]
    assert await scorer(None, checkers=["multi_choice"]).grade(msgs, "x", None) is None  # nothing can grade it
