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
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from core.config_base import REPO_ROOT, ConfigError, Section, custom_resources  # noqa: F401
from core.config_learning import (  # noqa: F401
    CollectiveConfig,
    EvolverConfig,
    GateConfig,
    LoRAConfig,
    ReplayConfig,
    RewardsConfig,
    RolloutConfig,
    SandboxConfig,
    SchedulerConfig,
    SkillsConfig,
    TrainConfig,
)
from core.config_serving import (  # noqa: F401
    LOCAL_MODELS,
    ContextConfig,
    EngineConfig,
    LLMEndpoint,
    ModelConfig,
    ProxyConfig,
    UpstreamEndpoint,
)
from core.config_state import MemoryConfig, RayConfig, StateConfig  # noqa: F401
from core.storage import remote_scheme

ENV_PREFIX = "CLAWRAY__"


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
