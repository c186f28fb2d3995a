"""The memory store contract, on both backends (SQLite + FTS5, PostgreSQL + tsvector; `state_cfg`): strict
scope isolation under adversarial ids, deletion that really deletes, forgets that win races with
ingestion, readers that catch up, retention."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from memory.index import VectorIndex
from memory.open import open_memory_store
from memory.rows import TOMBSTONE_KEEP_S
from memory.sqlite_store import SqliteMemoryStore
from memory.store import Merge, Plan, UnitFilter
from memory.units import Kind, Level, MemoryUnit, Scope, request_scopes, split_tenant
from tests.memory_fakes import WordEmbedder, entry

EMB = WordEmbedder()


@pytest.fixture
def store(state_cfg, tmp_path):
    s = open_memory_store(tmp_path, state_cfg, storage_root=tmp_path)
    yield s
    s.close()


def put(store, *units: MemoryUnit) -> None:
    assert store.apply(Plan(inserts=[(u, EMB.encode([u.content])[0]) for u in units]), [])


def mk(content: str, user: str, workspace: str | None = None, session: str | None = None, **kw) -> MemoryUnit:
    level = Level.session if session is not None else Level.workspace if workspace is not None else Level.user
    return MemoryUnit(kind=kw.pop("kind", Kind.semantic), content=content, level=level, user=user,
                      workspace=workspace, session=session, **kw)


# Ids an attacker may choose: separators, JSON, prefixes of each other, unicode look-alikes, empty-ish.
ADVERSARIAL = ["alice", "alice/w", "alice\x1f", "al", 'alice", "w', "ALICE", "аlice", "alice ", "a/lice",
               "%", "_", "alice/", '["user", "alice"]']


def test_scopes_of_different_id_tuples_never_share_a_key():
    scopes = set()
    for user, ws, sess in itertools.product(ADVERSARIAL[:8], ["w", "w/x", "x", ""], ["s", "s/1"]):
        for level in Level:
            ids = dict(workspace=ws if level != Level.user else None, session=sess if level == Level.session else None)
            scopes.add(Scope(level, user, **ids))
    assert len({s.key for s in scopes}) == len(scopes)


def test_tenant_split_is_unambiguous_because_user_ids_have_no_slash():
    assert split_tenant("alice/w/x") == ("alice", "w/x")
    with pytest.raises(ValueError):
        split_tenant("alice")


def test_no_request_ever_retrieves_another_owners_unit_with_adversarial_ids(store):
    """Every owner stores the SAME secret-bearing sentence; each request must see only its own copy."""
    owners = [(u, w) for u in ADVERSARIAL for w in ("w", "w/x", "x")]
    for u, w in owners:
        put(store, mk(f"The zanzibar code of {u!r} in {w!r} is secret", u, w))
    for u in ADVERSARIAL:
        put(store, mk(f"zanzibar user fact of {u!r}", u))
    from core.config import MemoryConfig
    from memory.retrieval import MemorySearch

    search = MemorySearch(store, MemoryConfig(min_similarity=-1.0, candidates=500, top_k=500), EMB)
    for u, w in owners:
        got = search.search("what is the zanzibar code", request_scopes(u, w, "s")).hits
        assert got, (u, w)
        for unit, _ in got:
            assert unit.user == u and unit.workspace in (w, None), (u, w, unit.user, unit.workspace)
        assert len(got) == 2
    search.close()


def test_the_vector_leg_overlapped_on_a_helper_thread_finds_what_the_sequential_search_finds(store):
    from core.config import MemoryConfig
    from memory.retrieval import MemorySearch

    put(store, *[mk(f"fact {i} about kumquat number {i % 7}", "alice", "w") for i in range(40)],
        mk("an unrelated banana", "alice", "w"))
    cfg = MemoryConfig(min_similarity=-1.0)
    sequential, overlapped = MemorySearch(store, cfg, EMB, overlap=False), MemorySearch(store, cfg, EMB)
    assert sequential._pool is None and overlapped._pool is not None
    now = 1e9
    for q in ["kumquat number 3", "banana", "fact 12", "nothing matches zz"]:
        a = sequential.search(q, request_scopes("alice", "w", "s"), now)
        b = overlapped.search(q, request_scopes("alice", "w", "s"), now)
        assert [(u.unit_id, s) for u, s in a.hits] == [(u.unit_id, s) for u, s in b.hits]
        assert (a.full_text, a.vector) == (b.full_text, b.vector) and a.vector > 0
    sequential.close()
    overlapped.close()


def test_fetch_is_the_isolation_check_whatever_ids_it_is_given(store):
    a, b = mk("alpha fact", "alice", "w"), mk("beta fact", "bob", "w")
    put(store, a, b)
    assert [u.unit_id for u in store.fetch([a.unit_id, b.unit_id], request_scopes("alice", "w", "s"))] == [a.unit_id]
    assert store.fetch([a.unit_id], request_scopes("alice", "other", "s")) == []


def test_full_text_is_scope_partitioned_and_drops_terms_too_common_to_rank(store):
    put(store, *[mk(f"common word number {i}", "alice", "w") for i in range(30)], mk("rare kumquat", "alice", "w"),
        mk("rare kumquat", "bob", "w"))
    key = Scope(Level.workspace, "alice", "w").key
    assert store.full_text([key], "kumquat", 10, max_df=20) == [store.list_units(
        UnitFilter("alice", "w", kind=Kind.semantic), 100)[0].unit_id]  # alice's only
    assert store.full_text([key], "common", 10, max_df=20) == []  # in 30 units: ignored
    assert len(store.full_text([key], "common", 50, max_df=50)) == 30


def _raw(store) -> bytes:
    """SQLite: the database file, WAL and shared memory as bytes. PostgreSQL: every row of every table of
    the store's schema as text (its pages are PostgreSQL's: pg_store.py's docstring)."""
    if isinstance(store, SqliteMemoryStore):
        data = b""
        for suffix in ("", "-wal", "-shm"):
            p = store.path.with_name(store.path.name + suffix)
            if p.exists():
                data += p.read_bytes()
        return data
    with store.db.tx() as c:
        tables = [r[0] for r in c.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
                                          (store.db.schema_name,)).fetchall()]
        assert {"units", "inbox", "vocab", "tombstones"} <= set(tables)
        return "".join(str(c.execute(f"SELECT t::text FROM {t} AS t").fetchall()) for t in tables).encode()


def test_forgetting_a_user_really_deletes_units_fts_rows_vectors_and_pending_turns(store):
    put(store, mk("The zanzibarsecret launch code is 1234", "alice"),
        mk("Zanzibarsecret workspace plan", "alice", "w"), mk("Zanzibarsecret session note", "alice", "w", "s"),
        mk("bob keeps this", "bob", "w"))
    assert store.inbox_add(entry("zanzibarsecret pending", user="alice", turn="p1"))
    assert b"zanzibarsecret" in _raw(store).lower()
    assert store.forget("alice") == 3
    assert b"zanzibarsecret" not in _raw(store).lower()  # no trace in the table, the FTS index or the WAL
    assert store.list_units(UnitFilter("alice", include_superseded=True), 100) == []
    assert store.inbox_pending("alice", "w", "s1") == []
    assert [u.content for u in store.list_units(UnitFilter(), 10)] == ["bob keeps this"]
    assert store.scope_versions([Scope(Level.user, "alice").key]) == {}
    assert not store.inbox_add(entry("said before the forget", user="alice", turn="p2", at=1.0))
    assert store.inbox_add(entry("said after the forget", user="alice", turn="p3", at=4e9))


def test_forgetting_a_workspace_or_session_leaves_the_rest(store):
    keep_user, ws, other_ws = mk("user level", "alice"), mk("ws level", "alice", "w"), mk("other ws", "alice", "v")
    sess = mk("session level", "alice", "w", "s")
    derived = mk("ws fact from session s", "alice", "w", source_session="s")
    put(store, keep_user, ws, other_ws, sess, derived)
    assert store.forget("alice", "w", "s") == 2  # the session's own units and those extracted from it
    assert {u.content for u in store.list_units(UnitFilter("alice"), 10)} == {"user level", "ws level", "other ws"}
    assert store.forget("alice", "w") == 1
    assert {u.content for u in store.list_units(UnitFilter("alice"), 10)} == {"user level", "other ws"}
    with pytest.raises(ValueError):
        store.forget("alice", None, "s")


def test_a_forget_during_extraction_discards_the_batch(store):
    """The batch was read from the inbox, the owner was forgotten, then the batch commits: nothing of it
    may be written (the consumed turns are gone, so `apply` refuses)."""
    e = entry("My editor is vim.", user="alice", turn="t1")
    assert store.inbox_add(e)
    batch = store.inbox_pending("alice", "w", "s1")
    store.forget("alice")
    assert not store.apply(Plan(inserts=[(mk("The user's editor is vim.", "alice"), None)]), [t.turn_id for t in batch])
    assert store.list_units(UnitFilter("alice", include_superseded=True), 10) == []


def test_a_consumed_turn_delivered_again_is_ignored(store):
    assert store.inbox_add(entry("hello there", turn="t1"))
    assert store.apply(Plan(), ["t1"])
    assert not store.inbox_add(entry("hello there", turn="t1"))
    assert not store.apply(Plan(), ["t1"])  # already consumed


def test_merge_and_supersession_keep_history(store):
    old = mk("The user's editor is vim.", "alice", key="editor")
    put(store, old)
    new = mk("The user's editor is emacs.", "alice", key="editor", supersedes=old.unit_id)
    assert store.apply(Plan(inserts=[(new, None)], supersessions=[(old.unit_id, new.unit_id)]), [])
    assert store.slot(Scope(Level.user, "alice"), Kind.semantic, "editor").unit_id == new.unit_id
    assert [u.unit_id for u in store.history(old.unit_id)] == [old.unit_id, new.unit_id]
    assert store.full_text([Scope(Level.user, "alice").key], "vim", 10, 100) == []  # history is not retrieved
    assert store.apply(Plan(merges=[Merge(new.unit_id, 2e9, 0.99, ["t9"])]), [])
    got = store.get(new.unit_id)
    assert (got.mentions, got.confidence, got.updated_at, got.source_turns[-1]) == (2, 0.99, 2e9, "t9")


def test_the_reader_index_follows_inserts_supersessions_deletions_and_forgets(store):
    index = VectorIndex(store, EMB.dim)
    a, b = mk("kiwi fruit", "alice", "w"), mk("mango fruit", "alice", "w")
    put(store, a, b)
    key = a.scope.key
    q = EMB.encode(["kiwi"])[0]
    assert index.search([key], q, 5)[0][0] == a.unit_id
    c = mk("kiwi smoothie", "alice", "w", supersedes=a.unit_id)
    store.apply(Plan(inserts=[(c, EMB.encode([c.content])[0])], supersessions=[(a.unit_id, c.unit_id)]), [])
    assert [h[0] for h in index.search([key], q, 5)][0] == c.unit_id
    assert a.unit_id not in [h[0] for h in index.search([key], q, 5)]
    store.delete_units([c.unit_id])
    assert [h[0] for h in index.search([key], q, 5)] == [b.unit_id]
    store.forget("alice")
    assert index.search([key], q, 5) == []
    d = mk("kiwi again", "alice", "w")  # the scope comes back after the forget: no stale rows
    put(store, d)
    assert [h[0] for h in index.search([key], q, 5)] == [d.unit_id]


def test_a_reader_behind_the_kept_tombstones_reloads_the_scope(store):
    index = VectorIndex(store, EMB.dim)
    a, b = mk("kiwi fruit", "alice", "w"), mk("mango fruit", "alice", "w")
    put(store, a, b)
    q = EMB.encode(["fruit"])[0]
    assert len(index.search([a.scope.key], q, 5)) == 2
    store.delete_units([a.unit_id])
    store.prune(100, None, now=4e9 + TOMBSTONE_KEEP_S)  # the tombstone of `a` is dropped
    assert [h[0] for h in index.search([a.scope.key], q, 5)] == [b.unit_id]


def test_retention_drops_superseded_history_first_then_the_oldest(store):
    units = [mk(f"fact {i}", "alice", updated_at=1000.0 + i) for i in range(5)]
    put(store, *units)
    store.apply(Plan(supersessions=[(units[4].unit_id, units[3].unit_id)]), [])
    assert store.prune(3, None, now=2000.0) == 2
    assert {u.content for u in store.list_units(UnitFilter("alice", include_superseded=True), 10)} == \
        {"fact 1", "fact 2", "fact 3"}
    assert store.prune(100, max_age_s=500.0, now=1502.5) == 2  # updated before 1002.5
    assert [u.content for u in store.list_units(UnitFilter("alice"), 10)] == ["fact 3"]


def test_stats_count_units_by_kind_and_level(store):
    put(store, mk("a b", "alice"), mk("c d", "alice", "w", kind=Kind.preference), mk("e f", "bob", "w", "s"))
    s = store.stats()
    assert s["units"] == 3 and s["by_kind"] == {"semantic": 2, "preference": 1}
    assert s["by_level"] == {"user": 1, "workspace": 1, "session": 1} and s["users"] == 2


def test_vectors_are_stored_as_float32_and_survive_a_reopen(state_cfg, tmp_path):
    s = open_memory_store(tmp_path, state_cfg)
    u = mk("kiwi fruit", "alice")
    put(s, u)
    s.close()
    s = open_memory_store(tmp_path, state_cfg)
    ch = s.scope_changes(u.scope.key, -1)
    (uid, kind, blob, active), = ch.rows
    assert uid == u.unit_id and active and np.allclose(np.frombuffer(blob, "<f4"), EMB.encode([u.content])[0])
    s.close()
