"""The session store with Proxy replicas on several hosts: two stores (two replicas' connections) on one
PostgreSQL database. Interleavings are driven by hooks that hold one replica inside its transaction."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

from core.config import StateConfig
from core.contracts import Turn
from serve.history import read_history
from serve.sessions import SessionStore
from tests.servers import unique_namespace


def _turn(sid, **kw):
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0], **kw)


@pytest.fixture
def replicas(pg_dsn, tmp_path):
    cfg = StateConfig(dsn=pg_dsn, namespace=unique_namespace())
    a, b = SessionStore(tmp_path / "a.db", cfg), SessionStore(tmp_path / "b.db", cfg)
    yield a, b
    a.close()
    b.close()


def _hold_after(store: SessionStore, marker: str, inside: threading.Event, go: threading.Event) -> None:
    """Make `store` pause inside its transaction right after running a statement containing `marker`."""
    real_tx = store._db.tx

    class Paused:
        def __init__(self, conn):
            self._conn = conn

        def execute(self, sql, params=()):
            cur = self._conn.execute(sql, params)
            if marker in sql and not inside.is_set():
                inside.set()
                assert go.wait(10)
            return cur

        def executemany(self, sql, seq):
            return self._conn.executemany(sql, seq)

    @contextmanager
    def tx(*locks):
        with real_tx(*locks) as conn:
            yield Paused(conn)

    store._db.tx = tx


def test_two_replicas_recording_one_session_chain_turns_in_order(replicas):
    """Replica A is inside its transaction (it has read the session's pending turns) when replica B records
    the next request of the same session: B waits for A (per-session lock) and then sees A's turn, so the
    indexes are 0 and 1 and A's turn is completed by B's request. Without the lock both read an empty
    session and both store index 0 (seen failing with the lock removed)."""
    a, b = replicas
    inside, go = threading.Event(), threading.Event()
    _hold_after(a, "state='pending'", inside, go)
    first = [{"role": "user", "content": "q"}]
    got: dict[str, list[Turn]] = {}
    ta = threading.Thread(target=lambda: got.setdefault("a", a.record([_turn("s", response_text="x")],
                                                                       read_history(first))))
    ta.start()
    assert inside.wait(10)
    nxt = first + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "fb"}]
    tb = threading.Thread(target=lambda: got.setdefault("b", b.record([_turn("s")], read_history(nxt))))
    tb.start()
    tb.join(0.5)
    assert tb.is_alive()  # B is held behind A's session lock, not racing it
    go.set()
    ta.join(10)
    tb.join(10)
    assert got["a"][0].turn_index == 0 and got["b"][0].turn_index == 1
    (done,) = b.claim(10, 60)
    assert done.turn_id == got["a"][0].turn_id and done.next_state == [{"role": "user", "content": "fb"}]


def test_other_sessions_do_not_wait_for_a_held_session(replicas):
    a, b = replicas
    inside, go = threading.Event(), threading.Event()
    _hold_after(a, "state='pending'", inside, go)
    ta = threading.Thread(target=lambda: a.record([_turn("s1")], None))
    ta.start()
    assert inside.wait(10)
    (t,) = b.record([_turn("s2")], None)  # returns while A still holds s1
    assert t.turn_index == 0
    go.set()
    ta.join(10)


def test_claims_of_two_replicas_are_disjoint_while_one_is_inside_its_claim(replicas):
    """Replica A has selected (and locked) the oldest completed turns and is paused before leasing them;
    replica B's claim skips the locked rows instead of taking them too (FOR UPDATE SKIP LOCKED)."""
    a, b = replicas
    for i in range(6):
        a.record([_turn(f"s{i}", last_in_session=True)], None)
    inside, go = threading.Event(), threading.Event()
    _hold_after(a, "ORDER BY updated_at LIMIT", inside, go)
    got: dict[str, list[Turn]] = {}
    ta = threading.Thread(target=lambda: got.setdefault("a", a.claim(4, 60)))
    ta.start()
    assert inside.wait(10)
    got["b"] = b.claim(4, 60)
    go.set()
    ta.join(10)
    ids_a, ids_b = {t.turn_id for t in got["a"]}, {t.turn_id for t in got["b"]}
    assert len(ids_a) == 4 and len(ids_b) == 2 and not ids_a & ids_b
