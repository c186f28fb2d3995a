"""Config sections of memory, state and the Ray cluster (core/config.py assembles them)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.config_base import ConfigError, Section
from core.config_serving import LLMEndpoint
from core.names import DEFAULT_NAMESPACE


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
    # Ray prestarts idle Python workers on a cluster it starts (two here, ~41 MB PSS each in the embedded default) so that tasks
    # need no process start. clawray's planes are actors, each in a process of its own, so on one machine
    # those workers sit idle. Off: a cluster clawray starts (local, or `clawray start`'s head) prestarts
    # none; a cluster it joins (`address`) keeps its own settings. docs/serving.md, memory.
    prestart_workers: bool = False
    head_port: int = Field(default=6390, ge=1024, le=65535)  # GCS port of the head `clawray start` runs
