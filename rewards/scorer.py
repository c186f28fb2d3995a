"""The scoring logic of one PRM, as a library class (no Ray): turn -> checker and/or judge -> Sample.

`PRM` (rewards/prm.py) is the thin Ray actor around it; tests use it directly.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

from core.agent_context import AGENT_CONTEXT_MARKERS
from core.config import ConfigError, RewardsConfig
from core.contracts import Sample, Turn, TurnType, Vote
from core.llm import LLMClient, LLMError
from rewards import opd
from rewards.checkers import CheckerSpecError, CheckResult, evaluate, resolve_inside
from rewards.engine_judge import EngineJudge
from rewards.errors import JudgeUnavailable
from rewards.judge import build_judge_messages
from rewards.scoring import SessionRule, build_sample, decide_reward, make_vote
from rewards.tokens import HFTokens, TokenCounter, WhitespaceTokens, load_tokens
from rewards.votes import parse_score

log = logging.getLogger(__name__)

DEFAULT_JUDGE_MAX_TOKENS = 256


def _evaluate_replay(spec: dict, reply: str, files: dict[str, bytes] | None, allowed) -> CheckResult:
    """`evaluate` on a replay: reply-only, or with `files` written to a fresh folder at the spec's workspace."""
    if files is None:
        return evaluate(spec, reply, None, allowed=allowed)
    with tempfile.TemporaryDirectory(prefix="clawray-grade-") as tmp:
        root = Path(tmp)
        ws = resolve_inside(root, str(spec["workspace"])) if spec.get("workspace") is not None else root
        ws.mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            target = resolve_inside(ws, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return evaluate(spec, reply, root, allowed=allowed)


class Scorer:
    """Scores turns with the programmatic checkers and/or `cfg.votes` judge votes.

    Args:
        cfg: the rewards section.
        judge / teacher: LLM clients (None = no judge / no OPD); `from_config` builds them.
        tokens: counts judge-prompt tokens (ideally the judge's tokenizer; the policy's is used
            when the judge is the policy's own deployment).
        policy_tokens: the policy's tokenizer, required for OPD (to verify the teacher's).
        workspace_root: where file checks look; None disables workspace checks.
        judge_max_tokens: max tokens of one judge reply.
    """

    def __init__(
        self,
        cfg: RewardsConfig,
        *,
        judge: LLMClient | EngineJudge | None = None,
        teacher: LLMClient | None = None,
        tokens: TokenCounter | None = None,
        policy_tokens: HFTokens | None = None,
        workspace_root: str | Path | None = None,
        judge_max_tokens: int = DEFAULT_JUDGE_MAX_TOKENS,
        agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS,
    ):
        if teacher is not None and policy_tokens is None:
            raise ConfigError(
                "rewards.teacher is set but no policy tokenizer path was given: OPD needs it to "
                "verify that the teacher uses the same tokenizer"
            )
        self.cfg = cfg
        self.judge = judge
        self.teacher = teacher
        self.tokens = tokens or WhitespaceTokens()
        self.policy_tokens = policy_tokens
        self.workspace_root = Path(workspace_root) if workspace_root else None
        self.judge_max_tokens = judge_max_tokens
        self.agent_markers = tuple(agent_markers)  # what in a user message is the agent's (core/agent_context.py)
        self.rule = SessionRule(cfg.at_least_one_trainable_per_session)
        self._teacher_checked = False

    @classmethod
    def from_config(
        cls,
        cfg: RewardsConfig,
        *,
        tokenizer_path: str | None = None,
        workspace_root: str | Path | None = None,
        judge_max_tokens: int = DEFAULT_JUDGE_MAX_TOKENS,
        engine_judge: dict[str, str] | None = None,
        agent_markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS,
    ) -> Scorer:
        """Build clients from `cfg.judge`/`cfg.teacher`; `tokenizer_path` = the policy's tokenizer.

        `engine_judge` ({"deployment", "app", "model"}, from the composition root) is where the votes go when
        `cfg.resolved_judge_source()` is `engine`: the served base model (rewards/engine_judge.py)."""
        tokens = load_tokens(tokenizer_path)
        source = cfg.resolved_judge_source()
        judge: LLMClient | EngineJudge | None = None
        if source == "external":
            judge = LLMClient(cfg.judge)
        elif source == "engine":
            if engine_judge is None:
                raise ConfigError("rewards judge source is the engine, but no engine deployment was given")
            judge = EngineJudge(**engine_judge)
        return cls(
            cfg,
            judge=judge,
            teacher=LLMClient(cfg.teacher) if cfg.teacher else None,
            tokens=tokens,
            policy_tokens=tokens if isinstance(tokens, HFTokens) else None,
            workspace_root=workspace_root,
            judge_max_tokens=judge_max_tokens,
            agent_markers=agent_markers,
        )

    async def check_teacher(self) -> None:
        """Verify the OPD teacher's tokenizer once (ConfigError on mismatch)."""
        if self.teacher is None or self._teacher_checked:
            return
        assert self.policy_tokens is not None  # enforced in __init__
        await opd.verify_same_tokenizer(self.teacher, self.policy_tokens.encode)
        self._teacher_checked = True

    async def score(self, turn: Turn) -> Sample | None:
        """The scored sample for `turn` (None for side turns).

        Raises:
            JudgeUnavailable / TeacherUnavailable: retryable; nothing was decided for this turn.
            ConfigError: the OPD teacher's tokenizer differs from the policy's.
        """
        if turn.turn_type == TurnType.side:
            return None
        check_task = asyncio.to_thread(self._check, turn)  # checkers block (files, subprocesses)
        check, votes = await asyncio.gather(check_task, self._votes(turn))
        if check is None and not votes and self.judge is None:
            log.info("turn %s: no checker applies and no judge is configured; reward 0", turn.turn_id)
        sample = build_sample(turn, check, votes, self.rule)
        if sample is not None and self.teacher is not None and sample.trainable:
            # Teacher logprobs only matter for tokens that are trained on.
            await self.check_teacher()
            sample.teacher_logprobs = await opd.teacher_logprobs(self.teacher, turn)
        return sample

    async def grade(self, messages: list[dict], reply: str, eval_spec: dict | None,
                    files: dict[str, bytes] | None = None) -> float | None:
        """A reply to `messages` graded in [0, 1] without a next state, as the validation gate replays
        tasks (evolve/gate.py): the task's checker score on the reply alone, else (no check sent) the
        judge's majority mapped from {-1, 0, 1} to {0, 0.5, 1}, else None (nothing can grade it).
        `files`: the workspace a replay with tools left (evolve/sandbox.py), laid out where the spec's
        workspace is, so file checks grade what the replay wrote. Without them a check that reads a
        workspace is None: a reply-only replay changed no files, so the user's workspace would grade the
        original session, not this reply. Raises JudgeUnavailable like `score`."""
        turn = Turn(session_id="validation", turn_index=0, messages=messages, prompt_ids=[], response_ids=[],
                    response_logprobs=[], response_text=reply, eval_spec=eval_spec)
        if eval_spec:
            if not self.cfg.checkers:
                return None
            try:
                check = await asyncio.to_thread(_evaluate_replay, eval_spec, reply, files, self.cfg.checkers)
            except CheckerSpecError:  # it needs a workspace it was not sent (or the spec is unusable)
                return None
            return float(check.score)
        votes = await self._votes(turn)
        if not any(v.score is not None for v in votes):
            return None
        reward, _ = decide_reward(None, votes)
        return (reward + 1.0) / 2.0

    async def score_rollout(self, turn: Turn) -> Sample | None:
        """A member of a re-sampled GRPO group (train/rollouts.py), scored as the gate grades a replay:
        the prompt's check on the reply alone, else the judge without a next state (MetaClaw's PRM);
        None when nothing can grade it (a check that reads the workspace: the user's files are those of
        the original turn, not of this response). Every graded member is trained (mask all ones): its
        advantage is relative to its group, so a reward of 0 among others is signal too."""
        check, votes = None, []
        if turn.eval_spec:
            if not self.cfg.checkers:
                return None
            try:
                check = await asyncio.to_thread(_evaluate_replay, turn.eval_spec, turn.response_text, None,
                                                self.cfg.checkers)
            except CheckerSpecError:
                return None
        else:
            if not turn.messages and self.policy_tokens is not None:  # the judge reads the served prompt
                text = self.policy_tokens.tokenizer.decode(turn.prompt_ids, skip_special_tokens=False)
                turn = turn.model_copy(update={"messages": [{"role": "user", "content": text}]})
            votes = await self._votes(turn, use_next_state=False)
            if not any(v.score is not None for v in votes):
                return None
        reward, source = decide_reward(check, votes)
        sample = Sample.from_turn(turn, reward, True, sample_id=turn.turn_id, votes=votes, reward_source=source)
        if self.teacher is not None:
            await self.check_teacher()
            sample.teacher_logprobs = await opd.teacher_logprobs(self.teacher, turn)
        return sample

    def _check(self, turn: Turn) -> CheckResult | None:
        if not turn.eval_spec or not self.cfg.checkers:
            return None
        try:
            return evaluate(turn.eval_spec, turn.response_text, self.workspace_root, allowed=self.cfg.checkers)
        except CheckerSpecError as e:
            # The spec's author's problem, not the model's: score as if no checker applied.
            log.warning("turn %s: eval spec not usable: %s", turn.turn_id, e)
            return None

    async def _votes(self, turn: Turn, use_next_state: bool | None = None) -> list[Vote]:
        """`cfg.votes` independent judge replies, each parsed (unparseable -> score None)."""
        if self.judge is None:
            return []
        use_next = self.cfg.use_next_state if use_next_state is None else use_next_state
        messages = build_judge_messages(turn, tokens=self.tokens, budget=self.cfg.judge_token_budget,
                                        use_next_state=use_next, markers=self.agent_markers)
        calls = [
            self.judge.chat(messages, temperature=self.cfg.temperature, max_tokens=self.judge_max_tokens)
            for _ in range(self.cfg.votes)
        ]
        # return_exceptions: let every call finish (no orphaned requests) before deciding.
        replies = await asyncio.gather(*calls, return_exceptions=True)
        for r in replies:
            if isinstance(r, LLMError):
                raise JudgeUnavailable(f"judge vote failed: {r}") from None
            if isinstance(r, BaseException):
                raise r
        texts = [r[0] if r else "" for r in replies]  # type: ignore[index]
        return [make_vote(t, parse_score(t)) for t in texts]

    def usage(self) -> dict[str, dict[str, int]]:
        out = {}
        if self.judge is not None:
            out["judge"] = self.judge.usage.as_dict()
        if self.teacher is not None:
            out["teacher"] = self.teacher.usage.as_dict()
        return out
