"""Memory injection at the Proxy: the block shares the token budget with skills, never overflows the
context, honours X-Memory-Scope and the anonymous user, and records exactly what it injected."""

from __future__ import annotations

import asyncio
import copy

import pytest

from core.config import MemoryConfig
from memory.budget import HEADER, render
from memory.retrieval import MemorySearch
from memory.sqlite_store import SqliteMemoryStore
from memory.store import Plan
from memory.units import Kind, Level, MemoryUnit, request_scopes
from serve.injection import add_to_system
from serve.memory_injection import MemoryInjector, prompt_tokens, reply_tokens, system_text
from tests.memory_fakes import WordEmbedder

EMB = WordEmbedder()


class Words:
    def count(self, text: str) -> int:
        return len(text.split())


@pytest.fixture
def store(tmp_path):
    s = SqliteMemoryStore(tmp_path / "memory.db")
    units = [MemoryUnit(kind=Kind.semantic, content=f"The kiwi deploy fact number {i} is stored here.",
                        level=Level.workspace, user="alice", workspace="w") for i in range(5)]
    units.append(MemoryUnit(kind=Kind.working_summary, content="Session kiwi summary.", level=Level.session,
                            user="alice", workspace="w", session="s1", key="summary"))
    units.append(MemoryUnit(kind=Kind.preference, content="The user likes kiwi answers.", level=Level.user,
                            user="alice"))
    s.apply(Plan(inserts=[(u, EMB.encode([u.content])[0]) for u in units]), [])
    yield s
    s.close()


def injector(store, max_model_len: int = 4096, **cfg) -> MemoryInjector:
    c = MemoryConfig(**{"min_similarity": 0.0, **cfg})
    return MemoryInjector(MemorySearch(store, c, EMB), c, Words(), max_model_len)


def body(text: str = "tell me the kiwi deploy fact", system: str = "You are terse.") -> dict:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": text}]}


def run(inj: MemoryInjector, b: dict, anthropic: bool = False, tenant: str = "alice/w", cap: str = "user",
        skills: str = "") -> tuple[list[str], int]:
    mark = inj.mark(b, anthropic)
    if skills:
        add_to_system(b, skills, anthropic)
    return asyncio.run(inj.inject(b, anthropic, tenant, "s1", cap, mark))


def test_injects_the_units_it_records_within_the_budget(store):
    b = body()
    ids, tokens = run(injector(store), b)
    text = system_text(b, False)
    assert text.startswith("You are terse.\n\n" + HEADER) and len(ids) == 6  # top_k
    for uid in ids:
        assert store.get(uid).content in text
    assert tokens == Words().count(text[len("You are terse.\n\n"):]) <= 512


def test_skills_take_their_share_of_the_budget_first(store):
    skills = "## Active Skills\n" + "skill " * 100
    for budget in (300, 150, 110, 90):
        b = body()
        ids, tokens = run(injector(store, context_token_budget=budget), b, skills=skills)
        assert tokens <= max(0, budget - Words().count(skills)) and (tokens == 0) == (not ids)
    assert tokens == 0 and system_text(b, False) == "You are terse.\n\n" + skills  # 90: skills used it all


def test_the_block_never_takes_the_context_the_prompt_and_reply_need(store):
    b = body()
    free = injector(store, max_model_len=100_000)
    full_ids, full_tokens = run(free, copy.deepcopy(b))
    before = prompt_tokens(b, False, Words())
    for room in (full_tokens + 5, full_tokens // 2, 10):
        b2 = {**copy.deepcopy(b), "max_tokens": 50}
        inj = injector(store, max_model_len=before + 50 + room)
        ids, tokens = run(inj, b2)
        assert tokens <= room and prompt_tokens(b2, False, Words()) + 50 <= inj.max_model_len
    assert ids == [] and tokens == 0


def test_reply_room_is_what_the_client_asked_else_the_reserve():
    assert reply_tokens({"max_tokens": 40}, 256) == 40
    assert reply_tokens({"max_completion_tokens": 30, "max_tokens": 40}, 256) == 30
    assert reply_tokens({}, 256) == 256 and reply_tokens({"max_tokens": "x"}, 7) == 7


def test_anthropic_system_prompts_get_the_block_too(store):
    b = {"system": [{"type": "text", "text": "Be brief."}], "messages": [{"role": "user", "content": "kiwi deploy fact"}],
         "max_tokens": 20}
    ids, _ = run(injector(store), b, anthropic=True)
    assert ids and b["system"][0] == {"type": "text", "text": "Be brief."} and HEADER in b["system"][1]["text"]


def test_memory_scope_caps_what_is_read_and_other_owners_see_nothing(store):
    def kinds(ids):
        return {store.get(i).kind for i in ids}

    inj = injector(store, top_k=10)
    assert kinds(run(inj, body())[0]) == {Kind.semantic, Kind.preference, Kind.working_summary}
    assert kinds(run(inj, body(), cap="workspace")[0]) == {Kind.semantic, Kind.working_summary}
    assert kinds(run(inj, body(), cap="session")[0]) == {Kind.working_summary}
    assert run(inj, body(), cap="off") == ([], 0)
    assert run(inj, body(), tenant="bob/w") == ([], 0)
    assert kinds(run(inj, body(), tenant="alice/other")[0]) == {Kind.preference}


def test_the_anonymous_default_user_gets_no_memory_unless_configured(store):
    store.apply(Plan(inserts=[(MemoryUnit(kind=Kind.semantic, content="kiwi for everyone", level=Level.user,
                                          user="default"), EMB.encode(["kiwi for everyone"])[0])]), [])
    assert run(injector(store), body(), tenant="default/default") == ([], 0)
    assert run(injector(store, include_default_user=True), body(), tenant="default/default")[0]


def test_nothing_relevant_changes_nothing(store):
    b = body("zzz qqq")
    before = copy.deepcopy(b)
    inj = injector(store, min_similarity=0.5)
    assert run(inj, b) == ([], 0) and b == before
    assert render([]) == ""


def test_the_metric_definitions_are_accepted_by_ray():
    """Ray validates names and boundaries when a metric is built: a bad one fails every Proxy replica."""
    from memory.metrics import IngestMetrics, ReadMetrics

    read = ReadMetrics()
    read.tokens.observe(0)
    read.latency.observe(0.001)
    IngestMetrics().gauges({"by_kind_level": {"semantic/user": 2}})


def test_a_repeated_user_message_is_encoded_once(store):
    """An agent's tool-call steps resend the same last user message: its query vector is cached."""
    emb = WordEmbedder()
    search = MemorySearch(store, MemoryConfig(min_similarity=0.0), emb)
    scopes = request_scopes("alice", "w", "s1")
    first = search.search("the kiwi deploy fact", scopes)
    again = search.search("the kiwi deploy fact", scopes)
    search.search("another kiwi question", scopes)
    assert emb.calls == [["the kiwi deploy fact"], ["another kiwi question"]]
    assert [u.unit_id for u, _ in first.hits] == [u.unit_id for u, _ in again.hits] and first.vector > 0


def test_request_meta_carries_the_memory_scope_and_refuses_ambiguous_user_ids():
    from serve.turns import RequestError, extract_meta

    meta = extract_meta({"messages": []}, {"x-user-id": "alice", "x-memory-scope": "Session"}, "c")
    assert (meta.tenant, meta.memory_scope, meta.memories) == ("alice/default", "session", ())
    assert extract_meta({"messages": [], "memory_scope": "off"}, {}, "c").memory_scope == "off"
    assert extract_meta({"messages": []}, {}, "c").memory_scope == "user"
    for headers in ({"x-memory-scope": "team"}, {"x-user-id": "alice/proj"}):
        with pytest.raises(RequestError):
            extract_meta({"messages": []}, headers, "c")
