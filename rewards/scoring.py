"""From a turn and its evidence (checker result and/or judge votes) to a Sample: reward and mask rules.

Rewards:
- a checker's credit s in [0, 1] maps to `2s - 1` in [-1, 1] (a failed check is -1, so failures
  train; partial multi-choice credit lands in between);
- judge votes -> majority in {-1, 0, 1} (ties and all-unparseable -> 0);
- when both ran, the checker decides (programmatic ground truth) and the votes stay for audit.

Loss mask (uniform over the response tokens, `Sample.from_turn`):
- reward 0 -> zero mask (no signal), kept for audit;
- a judge-scored turn without a next state -> zero mask (the judge had no evidence of the outcome);
  a checker-scored turn is trainable without one (the check is the evidence);
- side turns never become samples.
- Replies cut by `max_tokens` (finish_reason "length", `Turn.truncated`) follow ONE rule: they are
  scored and trained as they are. The tokens were sampled by the policy, so their logprobs and ratios
  are valid; the cut is part of the outcome the reward judges. Checkers see the text as it is; the
  judge is told the reply was cut off (rewards/judge.py `TRUNCATED_NOTE`), so it judges an unfinished
  answer as unfinished rather than as a choice to stop. The sample carries `truncated=True` for audit.
- "At least one trainable sample per session" (`SessionRule`): when the LAST turn of a session is
  scored and no earlier turn of that session was trainable, the last turn is made trainable if its
  reward is non-zero (the usual case: it was masked only because nothing followed it). A zero reward
  is never forced: it would move the batch's advantages without evidence. Earlier samples are
  already durable in the replay buffer and are not revisited.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from core.contracts import Sample, Turn, TurnType, Vote
from rewards.checkers import CheckResult
from rewards.votes import majority_vote

MAX_VOTE_CHARS = 2000  # a vote's text is audit, not a transcript


def checker_reward(result: CheckResult) -> float:
    """[0, 1] credit -> [-1, 1] reward."""
    return 2.0 * result.score - 1.0


def judge_reward(votes: Sequence[Vote]) -> int:
    return majority_vote([v.score for v in votes])


def decide_reward(check: CheckResult | None, votes: Sequence[Vote]) -> tuple[float, str]:
    """(reward, reward_source). Source: "checker:<name>", "checker:<name>+judge", "judge" or
    "none" (no evidence at all: reward 0)."""
    if check is not None:
        source = f"checker:{check.checker}" + ("+judge" if votes else "")
        return checker_reward(check), source
    if votes:
        return float(judge_reward(votes)), "judge"
    return 0.0, "none"


def is_trainable(reward: float, *, has_next_state: bool, from_checker: bool) -> bool:
    if reward == 0:
        return False
    return has_next_state or from_checker


class SessionRule:
    """The "at least one trainable sample per session" rule (see module docstring).

    State is per scorer process and bounded (oldest sessions forgotten first). NOTE: a session must
    be scored by one scorer for the rule to be exact (the PRM pool routes by session id); after a
    scorer restart the rule errs towards forcing, i.e. a session may get one extra trainable turn.
    """

    def __init__(self, enabled: bool = True, max_sessions: int = 100_000):
        self.enabled = enabled
        self.max_sessions = max_sessions
        self._has_trainable: OrderedDict[str, bool] = OrderedDict()

    def apply(self, turn: Turn, reward: float, trainable: bool) -> bool:
        """Whether the sample for `turn` is trainable after the rule; updates the session state."""
        sid = turn.session_id
        had = self._has_trainable.pop(sid, False)
        if not trainable and self.enabled and turn.last_in_session and not had and reward != 0:
            trainable = True
        if not turn.last_in_session:
            self._has_trainable[sid] = had or trainable
            while len(self._has_trainable) > self.max_sessions:
                self._has_trainable.popitem(last=False)
        return trainable


def make_vote(text: str, score: int | None) -> Vote:
    return Vote(text=text[:MAX_VOTE_CHARS], score=score)


def build_sample(
    turn: Turn,
    check: CheckResult | None,
    votes: Sequence[Vote],
    rule: SessionRule | None = None,
    teacher_logprobs: list[float] | None = None,
) -> Sample | None:
    """The scored sample for `turn`, or None for a side turn.

    `sample_id` is the turn id, so a turn scored twice (a retry after a crash) is stored once by
    sinks that ignore duplicate ids.
    """
    if turn.turn_type == TurnType.side:
        return None
    reward, source = decide_reward(check, votes)
    trainable = is_trainable(reward, has_next_state=bool(turn.next_state), from_checker=check is not None)
    if rule is not None:
        trainable = rule.apply(turn, reward, trainable)
    return Sample.from_turn(
        turn,
        reward,
        trainable,
        sample_id=turn.turn_id,
        votes=list(votes),
        reward_source=source,
        teacher_logprobs=teacher_logprobs,
    )
