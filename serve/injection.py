"""Skill injection at the Proxy: retrieve skills for the user's latest words, put them in the system prompt.

The query is the user's own text of the latest user message that has any (core/agent_context.py): an
agent's tool results and the context it wraps around the user's message are not what the user asked.

Uses the skills plane's read side (`evolve.retrieval.SkillSearch`) in-process — the one deliberate
cross-plane import (DESIGN.md): a hop per request would cost more than the retrieval. A new skill
generation is picked up without a restart: `refresh()` re-reads the library at most every
`skills.refresh_s` seconds (cheap when nothing changed), in every replica. The skills and the generation
recorded on the turn come from one snapshot of the library (`SkillSearch.lookup`).

With an object-storage root (`blob_root`) the library is the newest snapshot in the bucket
(evolve/snapshot_reader.py `SnapshotReader`), not a local folder: a background task started with the replica
polls it every `skills.refresh_s` (one LIST) and swaps a whole new `SkillSearch` in when a new version is
published, so requests never wait for the bucket and never see half a library.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.agent_context import latest_user_words
from core.config import SkillsConfig
from core.text import content_text

log = logging.getLogger("clawray.injection")


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def add_to_system(body: dict[str, Any], block: str, anthropic: bool) -> None:
    """Append `block` to the system prompt (OpenAI: first system message; Anthropic: `system`)."""
    if anthropic:
        system = body.get("system")
        if isinstance(system, list):
            body["system"] = [*system, {"type": "text", "text": block}]
        else:
            body["system"] = f"{system}\n\n{block}" if system else block
        return
    msgs = body["messages"]
    first = msgs[0] if msgs else None
    if first is not None and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, list):
            first = {**first, "content": [*content, {"type": "text", "text": block}]}
        else:
            first = {**first, "content": f"{content}\n\n{block}" if content else block}
        body["messages"] = [first, *msgs[1:]]
    else:
        body["messages"] = [{"role": "system", "content": block}, *msgs]


def fit_skills(skills: list, fits: Callable[[str], bool], render: Callable[[list], str]) -> list:
    """The skills (best first) whose rendered block `fits`: one that does not fit is skipped, and smaller
    ones after it may still go, so injection never pushes a request over the model's context."""
    chosen: list = []
    for s in skills:
        if fits(render([*chosen, s])):
            chosen.append(s)
    return chosen


class SkillInjector:
    def __init__(self, search: Any, cfg: SkillsConfig, reader: Any = None):
        """`search`: a `SkillSearch` over the local skills folder; or `reader`: a `SnapshotReader` of the
        bucket's snapshots (then `search` is its current one)."""
        self._search, self.cfg, self.reader = search, cfg, reader
        self._failing = False
        self._follower: asyncio.Task | None = None  # held: the loop keeps only a weak reference to tasks

    @property
    def search(self) -> Any:
        return self.reader.search if self.reader is not None else self._search

    @classmethod
    def build(cls, cfg: SkillsConfig, skills_dir: Path, blob_root: str | None = None) -> SkillInjector | None:
        """`skills_dir`: the storage root's skills folder; with `blob_root`, the snapshots are downloaded
        beside it (`skills-snapshots/`), never into it (an Evolver on this host writes there)."""
        if not cfg.enabled:
            return None
        if blob_root is not None:
            from evolve.snapshot_reader import SnapshotReader

            return cls(None, cfg, SnapshotReader(blob_root, skills_dir.with_name("skills-snapshots"), cfg))
        from evolve.bank import SkillBank
        from evolve.embedding import shared_cache
        from evolve.retrieval import SkillSearch

        skills_dir.mkdir(parents=True, exist_ok=True)
        # Shared with memory retrieval (serve/memory_injection.py): one model, one encode per query.
        embedder = shared_cache(cfg.embedding_model, cfg.embedding_encoder) if cfg.retrieval == "embedding" else None
        return cls(SkillSearch(SkillBank(skills_dir, cfg), cfg, embedder), cfg)

    def start(self) -> asyncio.Task | None:
        """On the replica's loop. A local folder needs no task: refresh is driven by requests (time-gated),
        so an idle replica does no work. The bucket is polled by a task (returned)."""
        if self.reader is not None and self._follower is None:
            self._follower = asyncio.get_running_loop().create_task(self._follow())
        return self._follower

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.refresh_s)
            try:
                await asyncio.to_thread(self.reader.poll)
            except Exception as e:  # noqa: BLE001 - the bucket may be unreachable a while: keep serving
                if not self._failing:  # the current library, and retry at the next tick
                    log.warning("cannot read the skill library from the bucket (%s); serving generation %d "
                                "until it can", e, self.reader.generation)
                self._failing = True
            else:
                if self._failing:
                    log.info("skill library readable again (version %d)", self.reader.version)
                self._failing = False

    async def inject(self, body: dict[str, Any], anthropic: bool, fits: Callable[[str], bool] | None = None,
                     tenant: str | None = None, query: str | None = None) -> tuple[list[str], int]:
        """Inject into `body` in place; returns (injected skill names, skill generation). `fits`: whether a
        skills block still fits the context (serve/context_manager.py `skill_fits`); None: no limit.
        `tenant` ("<user>/<workspace>"): its private skills are served too (evolve/scopes.py). `query`: what
        to retrieve for (None: `latest_user_words` of the body's messages with the built-in markers)."""
        names, generation, _ = await self.inject_block(body, anthropic, fits, tenant, query)
        return names, generation

    async def inject_block(self, body: dict[str, Any], anthropic: bool, fits: Callable[[str], bool] | None = None,
                           tenant: str | None = None, query: str | None = None) -> tuple[list[str], int, str]:
        """`inject`, also returning the block added ("" when none): the session store keeps it once
        instead of with every turn (serve/skill_blocks.py)."""
        from evolve.retrieval import render_skills_block
        from evolve.scopes import request_scopes

        if query is None:
            query = latest_user_words(body.get("messages"))
        scopes = request_scopes(tenant, self.cfg.groups) if tenant else None
        if self.cfg.retrieval == "embedding":  # query encoding is CPU work: keep it off the loop
            skills, generation = await asyncio.to_thread(self._retrieve, query, scopes)
        else:
            skills, generation = self._retrieve(query, scopes)
        if skills and fits is not None:
            skills = fit_skills(skills, fits, render_skills_block)
        block = render_skills_block(skills) if skills else ""
        if block:
            add_to_system(body, block, anthropic)
        return [s.name for s in skills], generation, block

    def _retrieve(self, query: str, scopes: frozenset[str] | None = None) -> tuple[list, int]:
        """(skills, their generation) from ONE library snapshot: a refresh landing between two separate
        reads would pair one library's skills with another's generation (issue 12 item 8)."""
        search = self.search  # read once: a snapshot swapped in meanwhile is used from the next request
        if self.reader is None:
            search.refresh()  # a bucket snapshot never changes: its reader swaps whole searches instead
        if not query:
            return [], search.generation  # nothing injected: any current generation is the truth
        return search.lookup(query, scopes=scopes)
