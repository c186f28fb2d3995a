"""Config sections of the serving plane (core/config.py assembles them): model, engine, context, proxy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from core.config_base import Section, custom_resources

LOCAL_MODELS = {"tiny": "tiny-chat", "tiny-instruct": "tiny-instruct"}  # model.path names -> folders of the cache


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
    # clawray before Ray starts), several times faster. clawray runs HAProxy with the stats page and metrics
    # port it opens on all interfaces moved to loopback (cluster/haproxy_loopback.py). `auto`: HAProxy on a
    # cluster clawray starts itself (the embedded runtime, `clawray start`) when `host` is loopback and the
    # HAProxy binary is there, Serve's proxy otherwise; a cluster clawray joins keeps what it was started
    # with. docs/serving.md "Ingress".
    http_ingress: Literal["auto", "serve", "haproxy"] = "auto"
    # With `haproxy`: Serve's own per-request HTTP metrics (serve_num_http_requests, latency). HAProxy sends a
    # log line per request that Serve's HAProxy manager parses in Python (~0.13 ms of CPU per request on 2
    # cores, ~0.1 ms of latency); clawray's own request metrics (clawray_proxy_requests_total, latency) are
    # kept either way. An explicit RAY_SERVE_HAPROXY_METRICS_ENABLED in the env wins.
    haproxy_serve_metrics: bool = False
    context: ContextConfig = Field(default_factory=ContextConfig)  # long sessions: fitted, not refused
    # Agents' own auxiliary requests (titles, summaries, suggestions, ...) without X-Turn-Type are side turns
    # (served, never trained on) by a phrase of their prompt that starts a system text or a line of the last
    # user message, or by the model they name (serve/side.py; docs/agents.md "Side requests").
    side_markers: list[str] | None = None  # None: the built-in markers, seen in real agents' traffic
    extra_side_markers: list[str] = Field(default_factory=list)  # added to side_markers (or the built-ins)
    side_models: list[str] = Field(default_factory=list)  # model ids whose requests are side requests
    # Parts of a user message an agent adds (reminders, environment, internal context), by their opening tag:
    # not the user's words: skills and memories are not retrieved for them, memory does not remember them as
    # said by the user, the evolvers and the judge do not read them as a turn's instruction (core/agent_context.py).
    agent_context_markers: list[str] | None = None  # None: the built-in markers, seen in real agents' traffic
    extra_agent_context_markers: list[str] = Field(default_factory=list)  # added to them
