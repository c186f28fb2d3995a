"""WAL checkpoints of the proxy's session store run off the request path.

With SQLite's default, the commit that takes the WAL past 1,000 pages copies them into the database file
inside that request (a 2-8 ms stall, ~1 turn in 80 at the whole-path benchmark's payload size: its p99).
Once a Dispatcher runs for the store, commits leave that to the dispatcher's checkpoint task."""

from __future__ import annotations

import asyncio

from core.contracts import Turn
from serve.outbox import Dispatcher
from serve.sessions import SessionStore

# A turn of the size the proxy stores: ~2,000 prompt ids (~10 KB of JSON), 3+ WAL pages with its indexes.
PROMPT = list(range(30_000, 32_000))


def _turn(i: int) -> Turn:
    return Turn(session_id=f"s{i}", turn_index=0, prompt_ids=PROMPT, response_ids=[3], response_logprobs=[-1.0],
                last_in_session=True)


def _record_in_place(store: SessionStore, n: int) -> None:
    """As the proxy's event loop records a turn when it is alone (serve/recorder.py)."""
    for i in range(n):
        assert store.try_record_batch([([_turn(i)], None, "")]) is not None


def _file_pages(path) -> int:
    return path.stat().st_size // 4096


class NullSink:
    async def submit(self, turns):
        pass


async def test_a_dispatched_store_never_checkpoints_inside_a_request(tmp_path):
    path = tmp_path / "s.db"
    store = SessionStore(path)
    d = Dispatcher(store, NullSink(), idle_s=3600, checkpoint_every_s=3600)  # its own checkpoints: not yet
    d.start()
    try:
        before = _file_pages(path)
        _record_in_place(store, 400)  # > 1,000 WAL pages: SQLite's default would have checkpointed inline
        assert _file_pages(path) == before, "a request's commit copied the WAL into the database file"
        store.checkpoint()  # what the dispatcher's task runs, in a thread
        assert _file_pages(path) > before + 1000
    finally:
        await d.stop()
        store.close()


async def test_the_dispatcher_runs_the_checkpoints(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    ran = asyncio.Event()
    loop = asyncio.get_running_loop()
    real = store.checkpoint

    def checkpoint():
        real()
        loop.call_soon_threadsafe(ran.set)

    store.checkpoint = checkpoint
    d = Dispatcher(store, NullSink(), idle_s=3600, checkpoint_every_s=0.01)
    d.start()
    try:
        await asyncio.wait_for(ran.wait(), 30)
    finally:
        await d.stop()
        store.close()


def test_checkpoints_past_the_backstop_still_happen_in_commits(tmp_path):
    """A store whose owner stopped checkpointing cannot grow its WAL without bound."""
    path = tmp_path / "s.db"
    store = SessionStore(path)
    store._db.defer_checkpoints(backstop_pages=200)
    before = _file_pages(path)
    _record_in_place(store, 150)
    assert _file_pages(path) > before + 200
    store.close()


def test_without_a_dispatcher_sqlite_defaults_apply(tmp_path):
    """The CLI's and the tests' stores keep SQLite's own checkpoints (nobody would run them otherwise)."""
    path = tmp_path / "s.db"
    store = SessionStore(path)
    before = _file_pages(path)
    _record_in_place(store, 400)
    assert _file_pages(path) > before + 1000
    store.close()


def test_postgres_has_nothing_to_defer(tmp_path, pg_dsn):
    from core.config import StateConfig
    from tests.servers import unique_namespace

    store = SessionStore(tmp_path / "unused.db", StateConfig(dsn=pg_dsn, namespace=unique_namespace()))
    try:
        assert store.defer_checkpoints() is False
        store.checkpoint()  # a no-op, not an error
        assert not (tmp_path / "unused.db").exists()
    finally:
        store.close()
