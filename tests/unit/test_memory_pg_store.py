"""PostgreSQL specifics of the memory store (the shared contract is tests/unit/test_memory_store.py, run on
both backends): full text ranked exactly as FTS5 ranks it, its statistics kept exact by every write,
isolation under ids and queries full of SQL and tsquery syntax, writers serialised so that readers'
catch-up misses nothing, and forget winning its race with `inbox_add`. A real PostgreSQL server (pgserver)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from core.config import ConfigError, MemoryConfig, StateConfig
from core.state import HOST_FILE
from memory import pg_store
from memory.actor import MemoryActor
from memory.index import VectorIndex
from memory.open import open_memory_store
from memory.pg_store import FtsDelta, PgMemoryStore, fts5_idf, tsquery_any
from memory.retrieval import MemorySearch
from memory.sqlite_store import SqliteMemoryStore
from memory.store import Merge, Plan, UnitFilter
from memory.units import Kind, Level, MemoryUnit, Scope, request_scopes
from serve.memory_injection import MemoryInjector, system_text
from tests.memory_fakes import WordEmbedder, entry, turn
from tests.servers import unique_namespace

EMB = WordEmbedder()
FRUIT = ["kiwi", "mango", "papaya", "guava", "lychee", "durian"]


@pytest.fixture
def pg_state(pg_dsn) -> StateConfig:
    return StateConfig(dsn=pg_dsn, namespace=unique_namespace())


@pytest.fixture
def pg(pg_state):
    s = PgMemoryStore(pg_state)
    yield s
    s.close()


def mk(content: str, user: str, workspace: str | None = None, **kw) -> MemoryUnit:
    level = Level.workspace if workspace is not None else Level.user
    return MemoryUnit(kind=kw.pop("kind", Kind.semantic), content=content, level=level, user=user,
                      workspace=workspace, **kw)


def put(store, *units: MemoryUnit) -> None:
    assert store.apply(Plan(inserts=[(u, EMB.encode([u.content])[0]) for u in units]), [])


def fts_stats_are_exact(store: PgMemoryStore) -> None:
    """`vocab` and `fts_totals` equal a recount over the active units."""
    with store.db.tx() as c:
        want_vocab = dict(c.execute("SELECT t, count(*) FROM units, unnest(ARRAY(SELECT DISTINCT x FROM "
                                    "unnest(units.terms) x)) t WHERE superseded_by IS NULL GROUP BY t").fetchall())
        have_vocab = dict(c.execute("SELECT term, docs FROM vocab").fetchall())
        want = c.execute("SELECT count(*), coalesce(sum(cardinality(terms)), 0) FROM units "
                         "WHERE superseded_by IS NULL").fetchone()
        have = c.execute("SELECT docs, tokens FROM fts_totals").fetchone()
    assert have_vocab == want_vocab
    assert tuple(have) == tuple(want)


# ---- full text --------------------------------------------------------------------------------------------
def corpus(rng: random.Random) -> list[MemoryUnit]:
    """Units of two users in user and workspace scopes; each has its own number of filler words, so no two
    units tie on BM25 (the order of ties is the one thing the engines may differ in)."""
    units = []
    for i in range(60):
        words = [w for w in rng.sample(FRUIT, rng.randint(1, 3)) for _ in range(rng.randint(1, 2))]
        words += [f"filler{i}x{j}" for j in range(i % 17)]
        rng.shuffle(words)
        user, ws = ("alice", "bob")[i % 2], (None, "w")[(i // 2) % 2]
        units.append(mk(" ".join(words) + f" n{i}", user, ws, updated_at=1e9 + i))
    return units


def test_full_text_ranks_exactly_like_fts5_through_every_kind_of_write(pg, tmp_path):
    sq = SqliteMemoryStore(tmp_path / "memory.db")
    units = corpus(random.Random(7))
    stores = (sq, pg)
    for s in stores:
        put(s, *units)
    fts_stats_are_exact(pg)
    keys = [Scope(Level.user, "alice").key, Scope(Level.workspace, "alice", "w").key]
    queries = [("kiwi", 100, 2000), ("kiwi mango", 7, 2000), ("papaya guava lychee", 100, 12),
               ("durian kiwi mango papaya guava lychee", 100, 9), ("n3 kiwi", 5, 2000)]

    def ranked() -> list[list[str]]:
        out = [sq.full_text(keys, q, limit, df) for q, limit, df in queries]
        assert out == [pg.full_text(keys, q, limit, df) for q, limit, df in queries]
        return out

    before = ranked()
    assert all(before[:4]) and len(before[0]) > 5  # the queries rank something
    new = mk("kiwi kiwi kiwi smoothie", "alice", supersedes=units[0].unit_id)
    for s in stores:  # supersession, merge, deletion, retention, forget: the statistics follow each
        assert s.apply(Plan(inserts=[(new, None)], supersessions=[(units[0].unit_id, new.unit_id)],
                            merges=[Merge(units[2].unit_id, 2e9, 0.9, ["t1"])]), [])
        assert s.delete_units([units[4].unit_id, units[6].unit_id]) == 2
        assert s.prune(100, max_age_s=10.0, now=1e9 + 18.5) == 6  # 0 (superseded), 1, 3, 5, 7, 8
        s.forget("bob")
    fts_stats_are_exact(pg)
    after = ranked()
    assert after != before and units[0].unit_id not in after[0] and new.unit_id in after[0]
    sq.close()


def test_fts5_idf_and_tsquery_quoting():
    assert fts5_idf(5, 3) == 1e-6  # log(2.5 / 3.5) < 0: clamped, as FTS5 does
    assert fts5_idf(5, 1) == pytest.approx(np.log(4.5 / 1.5))
    assert tsquery_any(["a", "o'b", "c\\d"]) == "'a' | 'o''b' | 'c\\\\d'"
    d = FtsDelta()
    d.add(["x", "y", "x"])
    d.remove(["y", "z"])
    assert (d.docs, d.tokens, d.changes()) == (0, 1, (["x", "z"], [1, -1]))


def test_quoted_lexemes_match_verbatim_in_postgresql(pg):
    odd = ["o'brien", "c\\d", "x|y", "!", "a:*", "(b)", "&"]
    with pg.db.tx() as c:
        for t in odd:
            assert c.execute("SELECT array_to_tsvector(?::text[]) @@ ?::tsquery", (odd, tsquery_any([t]))).fetchone()[0]
            assert not c.execute("SELECT array_to_tsvector(?::text[]) @@ ?::tsquery",
                                 ([o for o in odd if o != t], tsquery_any([t]))).fetchone()[0]


# ---- isolation --------------------------------------------------------------------------------------------
HOSTILE = ["'; DROP TABLE units; --", "o'brien", "%", "_", "a\\b", "x|y", "!kiwi", "kiwi:*", "(a) & b",
           'alice", "w', "alice", "ALICE", "alice/"]


def test_hostile_ids_and_queries_never_reach_another_owners_units_on_postgresql(pg):
    owners = [(u, w) for u in HOSTILE for w in ("w", "w'", "%")]
    for u, w in owners:
        put(pg, mk(f"The zanzibar code of {u!r} in {w!r} is secret", u, w))
    for u in HOSTILE:
        put(pg, mk(f"zanzibar user fact of {u!r}", u))
    search = MemorySearch(pg, MemoryConfig(candidates=500, top_k=500))  # full text only: no embedder
    for u, w in owners:
        for q in ("zanzibar code", "zanzibar' | 'code & !x", f"{u} {w} zanzibar:*"):
            got = search.search(q, request_scopes(u, w, "s")).hits
            assert len(got) == 2, (u, w, q)
            assert all(unit.user == u and unit.workspace in (w, None) for unit, _ in got), (u, w, q)
    assert pg.forget(HOSTILE[0]) == 4
    assert pg.list_units(UnitFilter(HOSTILE[0], include_superseded=True), 100) == []
    assert len(pg.list_units(UnitFilter(), 1000)) == 4 * (len(HOSTILE) - 1)
    fts_stats_are_exact(pg)


def test_a_nul_in_content_is_stored_as_a_replacement_character(pg):
    u = mk("kiwi\x00secret", "alice")
    put(pg, u)
    assert pg.get(u.unit_id).content == "kiwi\ufffdsecret"
    assert pg.full_text([u.scope.key], "kiwi", 5, 100) == [u.unit_id]


# ---- serialisation ----------------------------------------------------------------------------------------
def blocked_on_store_lock(store: PgMemoryStore) -> bool:
    with store.db.tx() as c:
        return c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0] > 0


def wait_until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def pause_in(store: PgMemoryStore, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make `store`'s next write stop inside its transaction, right after taking its change seq."""
    inside, release = threading.Event(), threading.Event()
    take = PgMemoryStore._next_seq

    def paused(c):
        seq = take(c)
        inside.set()
        assert release.wait(10)
        return seq

    monkeypatch.setattr(store, "_next_seq", paused)
    return inside, release


def test_a_write_that_took_an_earlier_seq_never_commits_behind_a_reader(pg_state, monkeypatch):
    """Writer A takes seq n and stalls before commit; writer B (another process's store) writes to the same
    scope. If B could take n+1 and commit first, a reader syncing then would record the scope at n+1 and
    never fetch A's unit (`seq > n+1`). STORE_LOCK makes B wait for A."""
    a, b, reader = (PgMemoryStore(pg_state) for _ in range(3))
    seed, ua, ub = mk("kiwi seed", "alice", "w"), mk("kiwi from a", "alice", "w"), mk("kiwi from b", "alice", "w")
    put(reader, seed)
    index, q, key = VectorIndex(reader, EMB.dim), EMB.encode(["kiwi"])[0], seed.scope.key
    assert [h[0] for h in index.search([key], q, 10)] == [seed.unit_id]
    inside, release = pause_in(a, monkeypatch)
    ta = threading.Thread(target=put, args=(a, ua))
    ta.start()
    assert inside.wait(10)
    tb = threading.Thread(target=put, args=(b, ub))
    tb.start()
    wait_until(lambda: not tb.is_alive() or blocked_on_store_lock(reader))
    index.search([key], q, 10)  # the reader syncs while A is uncommitted
    release.set()
    ta.join(10)
    tb.join(10)
    assert {h[0] for h in index.search([key], q, 10)} == {seed.unit_id, ua.unit_id, ub.unit_id}
    for s in (a, b, reader):
        s.close()


def test_a_forget_racing_inbox_add_leaves_no_pending_turn_of_the_forgotten(pg_state, monkeypatch):
    """`inbox_add` checked the forgets (none yet) and stalls before its insert commits; a forget of the
    user runs meanwhile. The turn was said before the forget, so it must not survive it."""
    adder, forgetter = PgMemoryStore(pg_state), PgMemoryStore(pg_state)
    inside, release = threading.Event(), threading.Event()
    check = pg_store._forgotten

    def checked_then_stall(*args):
        out = check(*args)
        inside.set()
        assert release.wait(10)
        return out

    monkeypatch.setattr(pg_store, "_forgotten", checked_then_stall)
    said = entry("my secret plan", user="alice", turn="t1", at=time.time())
    ta = threading.Thread(target=adder.inbox_add, args=(said,))
    ta.start()
    assert inside.wait(10)
    tf = threading.Thread(target=forgetter.forget, args=("alice",))
    tf.start()
    wait_until(lambda: not tf.is_alive() or blocked_on_store_lock(forgetter))
    release.set()
    ta.join(10)
    tf.join(10)
    assert adder.inbox_pending("alice", "w", "s1") == []
    assert adder.stats()["inbox_pending"] == 0
    adder.close()
    forgetter.close()


def test_a_catch_up_reports_the_version_its_rows_and_tombstones_are_from(pg, pg_state, monkeypatch):
    """A write that commits between the reader's queries must not leak into a catch-up stamped older:
    the head, the rows and the tombstones come from one snapshot."""
    first, late = mk("kiwi one", "alice", "w"), mk("kiwi two", "alice", "w")
    put(pg, first)
    writer, real_tx = PgMemoryStore(pg_state), pg.db.tx

    class WriteAfterHead:
        def __init__(self, c):
            self.c = c

        def execute(self, sql, params=()):
            cur = self.c.execute(sql, params)
            if sql.startswith("SELECT seq, floor FROM scopes"):
                put(writer, late)  # commits on another connection, between the head and the rows
            return cur

    @contextmanager
    def tx(*locks):
        with real_tx(*locks) as c:
            yield WriteAfterHead(c)

    monkeypatch.setattr(pg.db, "tx", tx)
    ch = pg.scope_changes(first.scope.key, 0)
    monkeypatch.setattr(pg.db, "tx", real_tx)
    assert [r[0] for r in ch.rows] == [first.unit_id]
    assert [r[0] for r in pg.scope_changes(first.scope.key, ch.seq).rows] == [late.unit_id]  # next catch-up
    writer.close()


# ---- selection --------------------------------------------------------------------------------------------
def test_the_state_config_selects_the_backend(pg_dsn, tmp_path):
    s = open_memory_store(tmp_path / "memory", {"dsn": pg_dsn, "namespace": unique_namespace()})
    assert isinstance(s, PgMemoryStore) and not (tmp_path / "memory").exists()
    s.close()
    s = open_memory_store(tmp_path / "memory", None, storage_root=tmp_path)
    assert isinstance(s, SqliteMemoryStore) and s.path == tmp_path / "memory" / "memory.db"
    s.close()
    (tmp_path / HOST_FILE).write_text("another-host\n")
    with pytest.raises(ConfigError, match="cannot be shared by several hosts"):
        open_memory_store(tmp_path / "memory", StateConfig(), storage_root=tmp_path)


def test_inbox_and_units_round_trip_exactly(pg):
    e = entry("héllo\nthere", user="o'brien", workspace="w/x", turn="t1", last=True)
    assert pg.inbox_add(e)
    assert pg.inbox_pending("o'brien", "w/x", "s1") == [e]
    assert pg.inbox_owners() == [("o'brien", "w/x", "s1", e.created_at, 1, 1)]
    u = mk("a fact", "o'brien", "w/x", source_turns=["t1", "t2"], confidence=0.75, updated_at=1.5e9)
    put(pg, u)
    assert json.loads(json.dumps(pg.get(u.unit_id).model_dump(mode="json"))) == u.model_dump(mode="json")


def test_the_memory_actor_and_a_proxy_on_other_hosts_share_memory_through_postgresql(pg_state, tmp_path):
    """The Memory actor ingests with its storage root on host A; a Proxy replica with its own root on host B
    injects what it stored, and no longer once the actor forgot the user; a store that cannot be read
    serves the request without memory."""
    cfg = MemoryConfig(embedding_model=None, every_n_turns=1)
    state = pg_state.model_dump()
    args = {"config": cfg.model_dump(), "tokenizer_path": None, "max_model_len": 4096}
    proxy = MemoryInjector.from_args(args, tmp_path / "b" / "memory", state)

    def inject() -> str:
        b = {"messages": [{"role": "user", "content": "where is the deploy target"}]}
        mark = proxy.mark(b, False)
        asyncio.run(proxy.inject(b, False, "alice/w", "s2", "user", mark))
        return system_text(b, False)

    async def remember(actor: MemoryActor) -> None:
        assert await actor.observe(turn("Remember that the deploy target is kumquat-7.", last=True))
        await asyncio.gather(*actor._tasks)

    actor = MemoryActor(str(tmp_path / "a" / "memory"), cfg, None, metrics=False, state=state)
    asyncio.run(remember(actor))
    assert "kumquat-7" in inject()
    assert asyncio.run(actor.forget("alice")) >= 1
    assert inject() == ""
    assert not (tmp_path / "a" / "memory" / "memory.db").exists() and not (tmp_path / "b").exists()
    proxy.search.store.close()  # the database is gone for this replica: it serves without memory
    assert inject() == ""
    actor.store.close()
