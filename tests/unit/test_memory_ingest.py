"""Ingestion: which turns are remembered, per-owner batches, scope caps, supersession across batches, the
working summary, extractor fallbacks, and the actor's triggers (every N turns, session end)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from core.config import MemoryConfig
from core.llm import LLMError
from memory.actor import MemoryActor
from memory.ingest import Ingestor, entry_of, scoped_units
from memory.sqlite_store import SqliteMemoryStore
from memory.store import UnitFilter
from memory.units import Candidate, Kind, Level
from tests.memory_fakes import WordEmbedder, entry, turn


@pytest.fixture
def store(tmp_path):
    s = SqliteMemoryStore(tmp_path / "memory.db")
    yield s
    s.close()


def contents(store, **flt) -> set[str]:
    return {u.content for u in store.list_units(UnitFilter(**flt), 100)}


def test_only_main_turns_of_a_named_user_with_memory_on_are_remembered():
    assert entry_of(turn("My editor is vim."), False).user_texts == ["My editor is vim."]
    assert entry_of(turn("x", tenant="default/w"), False) is None
    assert entry_of(turn("x", tenant="default/w"), True) is not None
    assert entry_of(turn("x", scope="off"), False) is None
    assert entry_of(turn("x", turn_type="side"), False) is None


def test_an_entry_holds_only_the_turns_new_user_input_never_the_injected_system_prompt():
    history = [{"role": "user", "content": "old question"}, {"role": "assistant", "content": "old answer"},
               {"role": "tool", "content": "tool output"}]
    e = entry_of(turn("new question", history=history), False)
    assert e.user_texts == ["new question"] and (e.user, e.workspace) == ("alice", "w")


def test_units_are_scoped_to_their_owner_and_narrowed_to_the_turns_cap():
    cands = [Candidate(kind=Kind.preference, content="Likes tea.", level=Level.user, source_turns=["a"]),
             Candidate(kind=Kind.semantic, content="Uses Go.", level=Level.workspace, source_turns=["b"]),
             Candidate(kind=Kind.episodic, content="Asked things.", level=Level.workspace)]
    entries = [entry("x", turn="a", cap="user"), entry("y", turn="b", cap="session")]
    got = scoped_units(cands, entries, ("alice", "w", "s1"), 5.0)
    assert [(u.level, u.user, u.workspace, u.session) for u in got] == [
        (Level.user, "alice", None, None), (Level.session, "alice", "w", "s1"), (Level.session, "alice", "w", "s1")]
    assert got[2].source_turns == ["a", "b"] and all(u.created_at == 5.0 for u in got)


def ingestor(store, **cfg) -> Ingestor:
    from memory.extract import OfflineExtractor

    return Ingestor(store, MemoryConfig(**cfg), OfflineExtractor(), WordEmbedder())


def test_a_later_batch_supersedes_a_slot_and_merges_a_repeat(store):
    ing = ingestor(store)
    store.inbox_add(entry("My editor is vim. I prefer tabs.", turn="t1", index=0))
    r1 = asyncio.run(ing.ingest(("alice", "w", "s1"), now=1000.0))
    assert r1.written and r1.inserted == 3 and r1.turns == 1  # editor, tabs, the episode
    store.inbox_add(entry("My editor is emacs now. I prefer tabs.", turn="t2", index=1, session="s2"))
    r2 = asyncio.run(ing.ingest(("alice", "w", "s2"), now=2000.0))
    assert (r2.superseded, r2.merged) == (1, 1)
    assert "The user's editor is emacs now." in contents(store, user="alice")
    assert "The user's editor is vim." not in contents(store, user="alice")
    assert "The user's editor is vim." in contents(store, user="alice", include_superseded=True)
    assert r2.lag_s == pytest.approx(2000.0 - 1.7e9)


def test_two_users_sharing_a_session_id_never_share_a_batch(store):
    ing = ingestor(store)
    store.inbox_add(entry("My editor is vim.", turn="a", user="alice"))
    store.inbox_add(entry("My editor is ed.", turn="b", user="mallory"))
    asyncio.run(ing.ingest(("alice", "w", "s1")))
    assert contents(store, user="mallory") == set() and store.inbox_pending("mallory", "w", "s1")
    assert "The user's editor is vim." in contents(store, user="alice")


def test_long_conversations_get_a_rolling_working_summary_with_history(store):
    ing = ingestor(store, summary_min_turns=2)
    store.inbox_add(entry("Fix the parser bug.", turn="t0", index=0))
    asyncio.run(ing.ingest(("alice", "w", "s1")))
    assert not [u for u in store.list_units(UnitFilter("alice"), 50) if u.kind == Kind.working_summary]
    store.inbox_add(entry("Now add tests for it.", turn="t1", index=1))
    asyncio.run(ing.ingest(("alice", "w", "s1")))
    store.inbox_add(entry("Ship it.", turn="t2", index=2))
    asyncio.run(ing.ingest(("alice", "w", "s1")))
    summaries = [u for u in store.list_units(UnitFilter("alice", include_superseded=True), 50)
                 if u.kind == Kind.working_summary]
    current = [u for u in summaries if u.active]
    assert len(summaries) == 2 and len(current) == 1 and current[0].level == Level.session
    assert current[0].content == "Session so far (3 turns). Topics: Now add tests for it. | Ship it."


class FailingExtractor:
    name = "llm"

    def __init__(self, error: Exception):
        self.error = error

    async def extract(self, entries):
        raise self.error


def test_an_unavailable_llm_leaves_the_turns_pending_and_a_bad_reply_falls_back(store):
    from memory.llm_extract import ExtractionError

    store.inbox_add(entry("My editor is vim.", turn="t1"))
    ing = Ingestor(store, MemoryConfig(), FailingExtractor(LLMError("down", retryable=True)))
    with pytest.raises(LLMError):
        asyncio.run(ing.ingest(("alice", "w", "s1")))
    assert len(store.inbox_pending("alice", "w", "s1")) == 1
    for error in (ExtractionError("not JSON"), LLMError("refused", status=400)):
        ing = Ingestor(store, MemoryConfig(), FailingExtractor(error))
        store.inbox_add(entry("My editor is vim.", turn=f"t-{error}"))
        report = asyncio.run(ing.ingest(("alice", "w", "s1")))
        assert report.written and report.extractor == "offline" and ing.fallbacks == 1


class GatedExtractor:
    """Blocks inside extraction until released: a forget can land exactly there."""

    name = "gated"

    def __init__(self):
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def extract(self, entries):
        self.entered.set()
        await self.release.wait()
        return [Candidate(kind=Kind.semantic, content="The user's editor is vim.", level=Level.user)]


def test_a_user_forgotten_while_their_turns_are_extracted_stays_forgotten(store):
    async def scenario():
        gate = GatedExtractor()
        ing = Ingestor(store, MemoryConfig(), gate, WordEmbedder())
        store.inbox_add(entry("My editor is vim.", turn="t1"))
        task = asyncio.create_task(ing.ingest(("alice", "w", "s1")))
        await gate.entered.wait()
        store.forget("alice")
        gate.release.set()
        return await task

    report = asyncio.run(scenario())
    assert not report.written and store.list_units(UnitFilter("alice", include_superseded=True), 10) == []


def test_the_actor_ingests_every_n_turns_and_at_session_end(tmp_path):
    async def scenario():
        actor = MemoryActor(str(tmp_path), MemoryConfig(every_n_turns=2), None, metrics=False)
        t0 = turn("My editor is vim.", index=0)
        assert await actor.observe(t0)
        assert not actor._tasks  # one pending turn: nothing due yet
        assert await actor.observe(turn("I prefer dark mode.", index=1))
        await asyncio.gather(*actor._tasks)
        first = await actor.stats()
        assert await actor.observe(turn("Remember that the deadline is Friday.", index=2, last=True,
                                        session="s9"))
        await asyncio.gather(*actor._tasks)
        assert not await actor.observe(turn("x", tenant="default/w"))  # anonymous: ignored
        assert not await actor.observe(t0)  # a re-delivery: ignored
        return first, await actor.stats()

    first, final = asyncio.run(scenario())
    assert first["units"] == 3 and first["inbox_pending"] == 0  # editor, dark mode, episode
    assert final["units"] == 5 and final["counts"]["turns_ingested"] == 3
    assert final["counts"]["turns_ignored"] == 1 and final["counts"]["turns_duplicate_or_forgotten"] == 1


def test_the_sweep_flushes_stale_conversations_and_applies_retention(tmp_path):
    async def scenario():
        actor = MemoryActor(str(tmp_path), MemoryConfig(every_n_turns=10, flush_after_s=60, max_units_per_scope=1),
                            None, metrics=False)
        await actor.observe(turn("My editor is vim. I prefer tabs.", created_at=1000.0))
        assert not actor._tasks
        await actor.sweep(now=1030.0)
        assert not actor._tasks  # not stale yet
        await actor.sweep(now=1061.0)
        await asyncio.gather(*actor._tasks)
        gone = await actor.sweep(now=1062.0)
        return gone, await actor.stats()

    gone, stats = asyncio.run(scenario())
    assert gone == 1 and stats["by_level"] == {"user": 1, "workspace": 1}  # 2 user-level units -> 1


def test_ingest_now_reports_what_was_written(tmp_path):
    async def scenario():
        actor = MemoryActor(str(tmp_path), MemoryConfig(every_n_turns=10), None, metrics=False)
        await actor.observe(turn("My editor is vim."))
        await actor.observe(turn("My editor is vim.", tenant="bob/w", session="b1"))
        return await actor.ingest_now("alice")

    (report,) = asyncio.run(scenario())
    assert report["owner"] == ["alice", "w", "s1"] and report["inserted"] == 2
    json.dumps(report)  # travels over Ray and to the CLI as JSON


RECORDED = [json.loads(line) for line in
            (Path(__file__).with_name("agent_side_requests.jsonl")).read_text().splitlines()]


@pytest.mark.parametrize("agent", ["claude-code", "codex", "qwen-code", "openclaw"])
def test_what_an_agent_puts_around_the_users_message_is_not_remembered_as_the_users(agent):
    """Seen failing before core/agent_context.py: Claude Code's episode was "the user asked: <system-reminder>
    Attribution for git commits ...", Qwen Code's reminders became a semantic unit, Codex's and OpenClaw's
    episodes held their environment and internal context."""
    from core.agent_context import AGENT_CONTEXT_MARKERS
    from memory.extract import OfflineExtractor
    from serve.apis import CHAT, MESSAGES, RESPONSES

    rec = next(r for r in RECORDED if r["agent"] == agent and r["request"] == "main: the first request of a prompt")
    api = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}[rec["api"]]
    messages = api.view(json.loads(json.dumps(rec["body"])))["messages"]
    e = entry_of(turn("", history=messages[:-1]).model_copy(update={"messages": messages}), False)
    said = " ".join(e.user_texts)
    assert "Create a file hello.txt saying hello" in said
    assert not any(m in said for m in AGENT_CONTEXT_MARKERS), said[:300]
    assert "Runtime:" not in said and "UTC]" not in said, said[:300]  # OpenClaw's stamp and runtime line
    units = asyncio.run(OfflineExtractor().extract([e]))
    assert [u.kind for u in units] == [Kind.episodic], [(u.kind, u.content[:80]) for u in units]
    # An operator's own agent's tag, by the same config the Proxy reads (cluster/system.py start_memory).
    mine = [*messages, {"role": "user", "content": [{"type": "text", "text": "Rename it"},
                                                    {"type": "text", "text": "<mine>cwd=/w"}]}]
    e = entry_of(turn("").model_copy(update={"messages": mine}), False, (*AGENT_CONTEXT_MARKERS, "<mine>"))
    assert e.user_texts[-1] == "Rename it"
