"""The data contracts every plane shares (DESIGN.md "Data contracts").

One record type per concept: `Turn` (what the serving plane captured for one assistant turn),
`Sample` (a scored turn, the unit of training), `Skill` (one SKILL.md), `AdapterManifest` (one published
LoRA version). This module imports no plane, so every plane can import it.
"""

from __future__ import annotations

import re
import time
import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SKILL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,63}$")
ADAPTER_NAME_RE = re.compile(r"^policy-v(\d{4,})$")


def now() -> float:
    """Wall-clock seconds since the epoch (the unit of every `*_at` field)."""
    return time.time()


def new_id() -> str:
    return uuid.uuid4().hex


class Record(BaseModel):
    """Base for contracts: unknown fields are refused so a typo never silently drops data."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TurnType(StrEnum):
    main = "main"  # trained on
    side = "side"  # served, never trained on


class Vote(Record):
    """One judge vote, kept with the sample for audit."""

    text: str  # the judge's raw reply (capped)
    score: int | None  # parsed score in {-1, 0, 1}; None = unparseable


class Sampling(Record):
    """The sampling parameters a response was drawn with, as the engine ran them (defaults included).

    The engine records each sampled token's logprob under exactly this distribution (vLLM
    `logprobs_mode=processed_logprobs`: logits / temperature, then top-k, then top-p), and the trainer
    recomputes its own logprobs with the same processing per row (train/step.py), so the importance
    ratio compares like with like. The defaults are the unprocessed distribution.
    """

    temperature: float = Field(default=1.0, ge=0)  # < 1e-5 means greedy: vLLM then reports temperature 1
    top_p: float = Field(default=1.0, gt=0, le=1)  # 1 = off
    top_k: int = Field(default=0, ge=0)  # 0 = off


class Turn(Record):
    """One assistant turn as captured at the proxy, token-exact (DESIGN.md request path 4).

    `prompt_ids` are the ids the engine rendered, `response_ids`/`response_logprobs` what it sampled;
    nothing here is ever re-tokenized from text.
    """

    turn_id: str = Field(default_factory=new_id)
    session_id: str
    turn_index: int = Field(ge=0)
    tenant: str = "default"  # "<user>/<workspace>"
    turn_type: TurnType = TurnType.main
    messages: list[dict[str, Any]] = Field(default_factory=list)  # request messages after injection
    prompt_ids: list[int]  # (P,) token ids the engine rendered
    response_ids: list[int]  # (R,) token ids the engine sampled
    response_logprobs: list[float]  # (R,) engine logprob of each sampled id, nats
    response_text: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)  # names of the tools the request offered
    finish_reason: str | None = None  # "length": cut by max_tokens (see `truncated`)
    sampling: Sampling = Field(default_factory=Sampling)  # what the response was sampled with
    # Output-token limit: what the client asked (max_tokens / max_completion_tokens / max_output_tokens;
    # None: none) and what the engine ran, clamped to what the context left (engine.clamp_max_tokens;
    # None: unknown, upstream mode).
    max_tokens_requested: int | None = None
    max_tokens_granted: int | None = None
    # What context management did to fit the conversation (serve/context.py: policy, limit, tokens before
    # and after, tool results shortened, messages dropped); None: it was sent as is. `messages` and
    # `prompt_ids` are what the engine saw after it.
    context: dict[str, Any] | None = None
    skills: list[str] = Field(default_factory=list)  # names of injected skills
    memories: list[str] = Field(default_factory=list)  # ids of injected memory units (memory/)
    memory_scope: Literal["user", "workspace", "session", "off"] = "user"  # X-Memory-Scope: widest scope
    skill_generation: int = Field(default=0, ge=0)
    adapter_version: str | None = None  # None = base model
    group_id: str | None = None  # set when n > 1 responses share one prompt
    group_size: int = Field(default=1, ge=1)  # responses sampled for that prompt (the group is whole at n)
    next_state: list[dict[str, Any]] | None = None  # messages that followed (feedback, tool results)
    last_in_session: bool = False  # no later turn will follow: X-Session-Done, the end route or idle flush
    idle_flushed: bool = False  # completed by the idle timeout: the conversation went quiet, not ended
    eval_spec: dict[str, Any] | None = None  # programmatic check sent by the client ("clawray_eval")
    created_at: float = Field(default_factory=now)

    @property
    def truncated(self) -> bool:
        """The reply was cut by the token limit (rewards/scoring.py states how such turns are handled)."""
        return self.finish_reason == "length"

    @model_validator(mode="after")
    def _lengths(self) -> Turn:
        if len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries, "
                f"response_ids has {len(self.response_ids)}"
            )
        return self


class Sample(Record):
    """One scored assistant turn: the unit the replay buffer stores and GRPO trains on."""

    sample_id: str = Field(default_factory=new_id)
    session_id: str
    turn_index: int = Field(ge=0)
    tenant: str = "default"
    prompt_ids: list[int]  # (P,)
    response_ids: list[int]  # (R,)
    response_logprobs: list[float]  # (R,) engine logprobs (behaviour policy, under `sampling`)
    sampling: Sampling = Field(default_factory=Sampling)  # the trainer's logprobs use the same processing
    truncated: bool = False  # the reply was cut by max_tokens (rewards/scoring.py's rule)
    reward: float
    loss_mask: list[int]  # (R,) 1 = token is trained on
    skill_generation: int = Field(ge=0)
    adapter_version: str | None = None
    group_id: str | None = None
    group_size: int = Field(default=1, ge=1)  # members of the group; leased together once all arrived
    created_at: float = Field(default_factory=now)
    # Audit fields (optional): how the reward was obtained.
    votes: list[Vote] = Field(default_factory=list)
    reward_source: str = ""  # e.g. "judge", "checker:iso8601", "judge+checker"
    teacher_logprobs: list[float] | None = None  # (R,) OPD teacher logprobs, same tokenizer only
    skills: list[str] = Field(default_factory=list)
    memories: list[str] = Field(default_factory=list)  # ids of the memory units the policy saw
    turn_id: str | None = None
    # The check the turn was sent with ("clawray_eval"): a re-sampled group (train/rollouts.py) grades
    # its responses to the same prompt with it.
    eval_spec: dict[str, Any] | None = None
    rollout_of: str | None = None  # re-sampled group member: the sample id whose prompt it answers

    @field_validator("loss_mask")
    @classmethod
    def _mask_binary(cls, v: list[int]) -> list[int]:
        if any(m not in (0, 1) for m in v):
            raise ValueError("loss_mask entries must be 0 or 1")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> Sample:
        n = len(self.response_ids)
        if len(self.response_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                "len(response_logprobs) == len(response_ids) == len(loss_mask) must hold, got "
                f"{len(self.response_logprobs)}, {n}, {len(self.loss_mask)}"
            )
        if self.teacher_logprobs is not None and len(self.teacher_logprobs) != n:
            raise ValueError("teacher_logprobs must have one entry per response token")
        return self

    @property
    def trainable(self) -> bool:
        return any(self.loss_mask)

    @classmethod
    def from_turn(
        cls, turn: Turn, reward: float, trainable: bool, **audit: Any
    ) -> Sample:
        """A sample for `turn` with a uniform mask (all ones if trainable, else all zeros)."""
        mask = [1 if trainable else 0] * len(turn.response_ids)
        return cls(
            session_id=turn.session_id,
            turn_index=turn.turn_index,
            tenant=turn.tenant,
            prompt_ids=turn.prompt_ids,
            response_ids=turn.response_ids,
            response_logprobs=turn.response_logprobs,
            sampling=turn.sampling,
            truncated=turn.truncated,
            reward=reward,
            loss_mask=mask,
            skill_generation=turn.skill_generation,
            adapter_version=turn.adapter_version,
            group_id=turn.group_id,
            group_size=turn.group_size,
            skills=turn.skills,
            memories=turn.memories,
            turn_id=turn.turn_id,
            eval_spec=turn.eval_spec,
            **audit,
        )


class Skill(Record):
    """One `<name>/SKILL.md`: YAML front matter + Markdown body (MetaClaw/SkillClaw layout)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str
    description: str = Field(min_length=1, max_length=1024)
    category: str = "general"
    body: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)  # origin sessions, version, times

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not SKILL_NAME_RE.fullmatch(v):
            raise ValueError(
                f"skill name {v!r} must match {SKILL_NAME_RE.pattern} (lowercase slug, 2-64 chars)"
            )
        return v


class AdapterManifest(Record):
    """`adapters/policy-vNNNN/manifest.json`: what a published LoRA version is."""

    name: str  # policy-vNNNN
    version: int = Field(ge=1)
    base_model: str
    rank: int = Field(ge=1)
    alpha: float
    target_modules: list[str]
    step: int = Field(ge=0)
    skill_generation: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: float = Field(default_factory=now)

    @model_validator(mode="after")
    def _name_matches_version(self) -> AdapterManifest:
        if self.name != adapter_name(self.version):
            raise ValueError(f"adapter name {self.name!r} does not match version {self.version}")
        return self


def tool_names(tools: Any) -> list[str]:
    """Names of a request's tool definitions, any client API: OpenAI chat (`{"function": {"name"}}`),
    Responses and Anthropic (`{"name"}`); anything else is skipped."""
    out: list[str] = []
    for spec in tools if isinstance(tools, list) else ():
        if not isinstance(spec, dict):
            continue
        fn = spec.get("function")
        name = (fn if isinstance(fn, dict) else spec).get("name")
        if isinstance(name, str) and name not in out:
            out.append(name)
    return out


def adapter_name(version: int) -> str:
    """`policy-v0007` for version 7: every published version has a new name (DESIGN.md)."""
    return f"policy-v{version:04d}"


def parse_adapter_name(name: str) -> int:
    m = ADAPTER_NAME_RE.fullmatch(name)
    if not m:
        raise ValueError(f"{name!r} is not an adapter version name (policy-vNNNN)")
    return int(m.group(1))


SampleState = Literal["fresh", "leased", "sealed", "trained", "retired", "support", "masked", "dead"]
