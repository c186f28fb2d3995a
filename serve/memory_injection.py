"""Memory injection at the Proxy: retrieve the request's memory units and add them to the system prompt.

Uses the memory plane's read side (`memory.retrieval.MemorySearch`) in-process, like skill injection
uses the skills plane's (DESIGN.md: a hop per request would cost more than the lookup). Runs after skill
injection, for main turns only: the skills block and the memory block share
`memory.context_token_budget` (skills first), and the memory block never takes more than the context
has room for after the prompt and the reply (its `max_tokens`, else `memory.reply_reserve_tokens`).
Tokens are counted with the served model's tokenizer when it is local, else estimated conservatively.

Scopes: the request's user, workspace and session, capped by `X-Memory-Scope` (memory/units.py). A
request of the anonymous user `default` gets no memory unless `memory.include_default_user`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.agent_context import latest_user_words
from core.config import MemoryConfig
from core.db import DatabaseError
from core.text import content_text
from memory.budget import MESSAGE_OVERHEAD_TOKENS, TokenCounter, fit, make_counter, memory_budget, render
from memory.ingest import DEFAULT_USER
from memory.open import open_memory_store
from memory.retrieval import MemorySearch
from memory.store import MemoryStore
from memory.units import request_scopes, split_tenant
from serve.injection import add_to_system

log = logging.getLogger("clawray.memory_injection")


def system_text(body: dict[str, Any], anthropic: bool) -> str:
    """The system prompt's text (OpenAI: a leading system/developer message; Anthropic: `system`)."""
    if anthropic:
        return content_text(body.get("system"))
    msgs = body.get("messages") or []
    first = msgs[0] if msgs else {}
    return content_text(first.get("content")) if first.get("role") in ("system", "developer") else ""


def prompt_tokens(body: dict[str, Any], anthropic: bool, counter: TokenCounter) -> int:
    """Tokens of the whole prompt: every message's text plus template overhead, the Anthropic system
    prompt and the tool definitions (an upper-bound estimate of what the engine will render)."""
    msgs = body.get("messages") or []
    n = sum(counter.count(content_text(m.get("content"))) + MESSAGE_OVERHEAD_TOKENS for m in msgs if isinstance(m, dict))
    if anthropic:
        n += counter.count(content_text(body.get("system"))) + MESSAGE_OVERHEAD_TOKENS
    if body.get("tools"):
        n += counter.count(json.dumps(body["tools"]))
    return n


def reply_tokens(body: dict[str, Any], reserve: int) -> int:
    """The reply's room: what the client asked for (times n choices share the prompt, not the room)."""
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    return int(asked) if isinstance(asked, int) and asked > 0 else reserve


class MemoryInjector:
    def __init__(self, search: MemorySearch, cfg: MemoryConfig, counter: TokenCounter, max_model_len: int):
        self.search, self.cfg, self.counter, self.max_model_len = search, cfg, counter, max_model_len
        self.metrics: Any = None  # memory.metrics.ReadMetrics, set by the deployment (needs a Ray worker)

    @classmethod
    def from_args(cls, args: dict[str, Any] | None, memory_dir: Path,
                  state: dict | None = None) -> MemoryInjector | None:
        """From what the composition root binds (`memory_args` in cluster/serve_app.py, and the `state`
        section: with `dsn` the store is PostgreSQL, memory/open.py); None = off."""
        if not args:
            return None
        return cls.build(MemoryConfig.model_validate(args["config"]), memory_dir, state=state,
                         tokenizer_path=args.get("tokenizer_path"), max_model_len=int(args["max_model_len"]))

    @classmethod
    def build(cls, cfg: MemoryConfig, memory_dir: Path, *, tokenizer_path: str | None,
              max_model_len: int, state: dict | None = None) -> MemoryInjector | None:
        if not cfg.enabled:
            return None
        embedder = None
        if cfg.embedding_model:
            from evolve.embedding import shared_cache  # the skills plane's offline MiniLM loader

            # The replica's one model and query cache, shared with embedding skill retrieval: the query (the
            # user's latest words, core/agent_context.py) that skills encoded is not encoded again here.
            embedder = shared_cache(cfg.embedding_model, cfg.embedding_encoder)
        search = MemorySearch(open_memory_store(memory_dir, state), cfg, embedder)
        return cls(search, cfg, make_counter(tokenizer_path), max_model_len)

    def enable_metrics(self) -> None:
        from memory.metrics import ReadMetrics

        self.metrics = ReadMetrics()

    def mark(self, body: dict[str, Any], anthropic: bool) -> int:
        """Call before skill injection: where the system prompt ends now (skills are appended after)."""
        return len(system_text(body, anthropic))

    async def inject(self, body: dict[str, Any], anthropic: bool, tenant: str, session_id: str, cap: str,
                     mark: int, room: int | None = None, query: str | None = None) -> tuple[list[str], int]:
        """Inject into `body` in place; returns (injected unit ids, tokens of the memory block). `room`: the
        tokens skills and memory may take together, as context management counted them before the skills
        went in (serve/context_manager.py `injection_room`); None: only this injector's own estimate.

        Memory is context, not a dependency: a store that cannot be read serves the request without it.
        """
        try:
            return await self._inject(body, anthropic, tenant, session_id, cap, mark, room, query)
        except (sqlite3.Error, DatabaseError, OSError) as e:
            log.warning("memory retrieval failed (%s: %s); serving without memory", type(e).__name__, e)
            return [], 0

    async def _inject(self, body: dict[str, Any], anthropic: bool, tenant: str, session_id: str, cap: str,
                      mark: int, shared_room: int | None = None, query: str | None = None) -> tuple[list[str], int]:
        user, workspace = split_tenant(tenant)
        if user == DEFAULT_USER and not self.cfg.include_default_user:
            return [], 0
        scopes = request_scopes(user, workspace, session_id, cap)
        if query is None:
            query = latest_user_words(body.get("messages"))
        if not scopes or not query.strip():
            return [], 0
        result = await asyncio.to_thread(self.search.search, query, scopes)
        ids, tokens = [], 0
        if result.hits:
            skill_tokens = self.counter.count(system_text(body, anthropic)[mark:])
            room = (self.max_model_len - prompt_tokens(body, anthropic, self.counter)
                    - reply_tokens(body, self.cfg.reply_reserve_tokens))
            if shared_room is not None:
                room = min(room, shared_room - skill_tokens - MESSAGE_OVERHEAD_TOKENS)
            budget = memory_budget(self.cfg.context_token_budget, skill_tokens, room)
            chosen, tokens = fit([u for u, _ in result.hits], budget, self.counter)
            if chosen:
                add_to_system(body, render(chosen), anthropic)
                ids = [u.unit_id for u in chosen]
        if self.metrics is not None:
            self.metrics.latency.observe(result.seconds)
            self.metrics.tokens.observe(tokens)
        return ids, tokens


# ---- admin routes (serve/proxy.py) ------------------------------------------------------------------------
async def run_admin(injector: MemoryInjector | None, fn: Callable[[MemoryStore, MemorySearch], Any]) -> Any:
    """`fn(store, search)` off the event loop (the store's calls block); AdminError(409) while memory is off."""
    from memory.admin import AdminError

    if injector is None:
        raise AdminError("memory is disabled (memory.enabled)", 409)
    return await asyncio.to_thread(fn, injector.search.store, injector.search)
