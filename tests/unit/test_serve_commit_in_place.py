"""A turn recorded while no other request of the replica is in flight commits in place on the event loop
(serve/recorder.py `alone`), and only when SQLite can begin at once: a busy connection or another process
holding the file's write lock sends it to a thread as before, without the loop ever waiting.

Interleavings are driven by held locks, an open transaction of a second connection and engine replies
released by events; no sleeps.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from core.contracts import Turn
from serve.local_handle import LocalHandle
from serve.proxy import ProxyImpl
from serve.recorder import GroupCommit
from serve.sessions import SessionStore
from tests.unit.test_invariant_next_state import ScriptedEngine, _request, user


def _turn(sid: str) -> Turn:
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0])


@pytest.fixture
def store(tmp_path):
    s = SessionStore(tmp_path / "s.db")
    yield s
    s.close()


def _threads_of(store: SessionStore) -> list[int]:
    """The ids of the threads that ran each recording transaction."""
    seen, inner = [], store._record_all

    def spy(db, items, now):
        seen.append(threading.get_ident())
        return inner(db, items, now)

    store._record_all = spy
    return seen


def test_an_alone_record_commits_on_the_loop_and_others_in_a_thread(store):
    seen, rec = _threads_of(store), GroupCommit(store)

    async def run():
        await rec.record([_turn("a")], None, alone=True)
        await rec.record([_turn("b")], None)  # not alone: the group commit's thread
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert seen[0] == loop_thread and seen[1] != loop_thread
    assert (rec.commits, rec.in_place) == (2, 1)
    assert {t.session_id for t in store.turns()} == {"a", "b"}


def test_a_busy_connection_sends_the_record_to_a_thread_without_blocking_the_loop(store):
    seen, rec = _threads_of(store), GroupCommit(store)
    store._db._lock.acquire()  # another thread's transaction (the dispatcher's claim) holds the connection

    async def run():
        task = asyncio.create_task(rec.record([_turn("a")], None, alone=True))
        for _ in range(5):
            await asyncio.sleep(0)  # the loop keeps running: the record did not wait on the lock in place
        assert not task.done() and rec.in_place == 0
        store._db._lock.release()
        await task
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert seen[0] != loop_thread and (rec.commits, rec.in_place) == (1, 0)
    assert [t.session_id for t in store.turns()] == ["a"]


def test_another_process_writing_sends_the_record_to_a_thread_and_keeps_the_busy_timeout(store, tmp_path):
    rec = GroupCommit(store)
    other = sqlite3.connect(str(tmp_path / "s.db"), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the file's write lock, as a CLI or a second replica would

    async def run():
        task = asyncio.create_task(rec.record([_turn("a")], None, alone=True))
        for _ in range(5):
            await asyncio.sleep(0)  # try_tx gave up at once (busy_timeout 0) instead of waiting up to 30 s
        assert not task.done() and rec.in_place == 0
        other.execute("COMMIT")
        await task

    asyncio.run(run())
    other.close()
    assert [t.session_id for t in store.turns()] == ["a"] and rec.in_place == 0
    assert store._db._db.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000  # restored for `tx`


def test_a_failing_in_place_record_rolls_back_and_fails_only_its_request(store):
    rec = GroupCommit(store)
    dup = _turn("a")

    async def run():
        await rec.record([dup], None, alone=True)
        with pytest.raises(sqlite3.IntegrityError):
            await rec.record([dup], None, alone=True)  # the same turn id again
        await rec.record([_turn("b")], None, alone=True)  # the connection is usable: no transaction left open

    asyncio.run(run())
    assert sorted(t.session_id for t in store.turns()) == ["a", "b"] and rec.in_place == 2


class GatedEngine(ScriptedEngine):
    """Each request's reply waits for its own event, so the test decides which request finishes first."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []

    async def chat(self, body):
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return self._reply(body, anthropic=False)


@pytest.fixture
def proxy(tmp_path):
    engine = GatedEngine()
    impl = ProxyImpl(LocalHandle(engine), {}, {"enabled": False}, str(tmp_path))
    impl._started = True  # no background dispatcher
    impl.script = engine
    yield impl
    impl.store.close()


def _body(text: str, **extra) -> dict:
    return {"model": "m", "messages": [user(text)], **extra}


def test_the_proxy_records_in_place_only_while_no_other_request_waits_on_the_engine(proxy):
    engine, seen = proxy.script, _threads_of(proxy.store)
    engine.say("one").say("two")

    async def run():
        first = asyncio.create_task(proxy.generate(_request(_body("u1"), "s1"), anthropic=False))
        second = asyncio.create_task(proxy.generate(_request(_body("u2"), "s2"), anthropic=False))
        while len(engine.gates) < 2:
            await asyncio.sleep(0)
        engine.gates[0].set()  # the first finishes while the second still waits on the engine
        r1 = await first
        assert proxy.recorder.in_place == 0  # recorded in a thread: the second may join a group commit
        engine.gates[1].set()  # now alone
        r2 = await second
        return r1, r2, threading.get_ident()

    r1, r2, loop_thread = asyncio.run(run())
    assert r1.status_code == r2.status_code == 200
    assert seen[0] != loop_thread and seen[1] == loop_thread and proxy.recorder.in_place == 1
    assert proxy._waiting == 0
    assert {t.response_text for t in proxy.store.turns()} == {"one", "two"}


def test_a_stream_alone_records_in_place_before_its_terminal_event(proxy):
    proxy.script.say("streamed")

    async def run():
        response = await proxy.generate(_request(_body("u", stream=True), "s"), anthropic=False)
        chunks = [c async for c in response.body_iterator]
        return chunks

    chunks = asyncio.run(run())
    assert chunks[-1].startswith("data: [DONE]") and proxy.recorder.in_place == 1 and proxy._waiting == 0
    assert [t.response_text for t in proxy.store.turns("s")] == ["streamed"]
