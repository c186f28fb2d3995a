"""`train/run_lock.py`: one trainer per storage root, across threads and processes (issue 12 item 3), on
both state backends (SQLite file, PostgreSQL: the `state_cfg` fixture; issue 13).

Races are driven by barriers and events (threads released together, a child process that holds the lock
until told) or by a hook between a taker's read and its write, never by sleeps; expiry is driven by an
injected clock.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from core.storage import StorageLayout
from train.run_lock import RunLock, RunLockBusy, acquire_run_lock, pid_alive, run_lock_for


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def open_lock(state_cfg, tmp_path):
    """`open_lock(**kw)`: a `RunLock` on this test's backend (another process's view of the same lock:
    same file, or same PostgreSQL namespace); all closed at the end."""
    opened: list[RunLock] = []

    def make(**kw) -> RunLock:
        opened.append(RunLock(tmp_path / "run_lock.db", state=state_cfg, **kw))
        return opened[-1]

    make.state = state_cfg
    make.path = tmp_path / "run_lock.db"
    yield make
    for lock in opened:
        lock.close()


def test_of_racing_starts_exactly_one_holds_the_lock_and_the_others_are_told_who(open_lock):
    n = 8
    locks = [open_lock() for _ in range(n)]
    barrier = threading.Barrier(n)
    won: list = []
    refused: list[RunLockBusy] = []

    def start(i: int) -> None:
        lock = locks[i]
        barrier.wait()  # every thread tries at once
        try:
            won.append(lock.acquire(f"starter {i}", heartbeat=False))
        except RunLockBusy as e:
            refused.append(e)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == n - 1
    holder = won[0].holding
    for e in refused:
        assert str(e).startswith("a training run is already running since ")
        assert holder.holder in str(e) and f"pid {os.getpid()}" in str(e)
        assert e.holding.token == holder.token
    won[0].release()
    assert open_lock().current() is None


def _hold(path: str, state: dict, held, done) -> None:
    """Child process: take the lock, say so, hold it until told (or killed)."""
    lease = RunLock(path, state=state).acquire("python -m train.job run 'grpo'")
    held.set()
    done.wait(60)
    lease.release()


@pytest.fixture
def child_holding(open_lock):
    ctx = multiprocessing.get_context("spawn")
    held, done = ctx.Event(), ctx.Event()
    args = (str(open_lock.path), open_lock.state.model_dump(), held, done)
    proc = ctx.Process(target=_hold, args=args, daemon=True)
    proc.start()
    assert held.wait(60), "the child never took the lock"
    yield open_lock, proc, done
    # NOTE: only a live child may be told: setting a multiprocessing Event whose waiter was SIGKILLed
    # blocks for ever (its Condition waits for the dead sleeper to wake).
    if proc.is_alive():
        done.set()
        proc.join(30)


def test_a_lock_held_by_another_process_refuses_then_frees_on_release(child_holding):
    open_lock, proc, done = child_holding
    with pytest.raises(RunLockBusy, match=rf"already running since .*python -m train.job.*pid {proc.pid}"):
        open_lock().acquire("Controller manual run 1", heartbeat=False)
    done.set()
    proc.join(30)
    lease = open_lock().acquire("Controller manual run 1", heartbeat=False)
    assert lease.previous is None  # given back, not taken over
    lease.release()


def test_a_killed_holder_on_this_host_is_taken_over_at_once(child_holding):
    open_lock, proc, _ = child_holding
    os.kill(proc.pid, signal.SIGKILL)  # a Controller killed mid-run: no release, lease not expired
    proc.join(30)
    lease = open_lock().acquire("restarted Controller", heartbeat=False)
    assert lease.previous is not None and lease.previous.pid == proc.pid
    assert lease.previous.holder == "python -m train.job run 'grpo'"
    lease.release()


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew_or_release_it(open_lock):
    clock = Clock()
    lock = open_lock(ttl_s=60, clock=clock)
    old = lock.acquire("hung run", heartbeat=False)
    with pytest.raises(RunLockBusy):
        lock.acquire("new run", heartbeat=False)
    clock.now += 61  # its holder stopped renewing (hung, or died on another host)
    new = lock.acquire("new run", heartbeat=False)
    assert new.previous.token == old.holding.token
    assert not lock.renew(old.holding.token)
    old.release()  # must not free the lock it no longer holds
    assert lock.current().token == new.holding.token
    assert lock.renew(new.holding.token)
    new.release()


def test_a_holder_whose_lease_was_taken_over_is_told_to_stop(open_lock):
    lease = open_lock(ttl_s=0.03).acquire("stalled run")  # heartbeat every 10 ms
    told = threading.Event()
    lease.on_lost(told.set)
    # Another process judges the holder dead (its pid gone) and takes over; the next renewal fails.
    open_lock(is_alive=lambda pid: False).acquire("new run", heartbeat=False)
    assert told.wait(30) and lease.lost.is_set()
    lease.release()
    assert open_lock().current().holder == "new run"


@pytest.mark.parametrize("lock_was", ["free", "stale"])
def test_of_two_takers_whose_reads_raced_the_one_whose_swap_loses_is_refused_naming_the_winner(pg_dsn, tmp_path,
                                                                                             lock_was):
    """PostgreSQL (READ COMMITTED, no lock between a taker's read and its write): both takers see the
    lock free (or stale) and both write; the compare-and-swap lets exactly one through. Driven by a hook:
    taker B takes the lock between taker A's read and A's write. (SQLite cannot interleave them: the
    read and the write are one BEGIN IMMEDIATE transaction.)"""
    from core.config import StateConfig
    from tests.servers import unique_namespace

    state, clock = StateConfig(dsn=pg_dsn, namespace=unique_namespace()), Clock()
    a, b = (RunLock(tmp_path / "unused.db", state=state, clock=clock) for _ in range(2))
    try:
        if lock_was == "stale":
            a.acquire("hung run", heartbeat=False)
            clock.now += a.ttl_s + 1
        claim, won = a._claim, []

        def b_first(c, previous, mine):
            if not won:
                won.append(b.acquire("taker B", heartbeat=False))  # commits before A writes
            return claim(c, previous, mine)

        a._claim = b_first
        with pytest.raises(RunLockBusy, match="taker B") as refused:
            a.acquire("taker A", heartbeat=False)
        assert refused.value.holding.token == won[0].holding.token
        assert a.current().token == won[0].holding.token  # B's holding stands, A wrote nothing
        assert not (tmp_path / "unused.db").exists()  # PostgreSQL: no SQLite file is created
        won[0].release()
    finally:
        a.close()
        b.close()


def test_on_postgresql_every_storage_root_shares_one_lock(pg_dsn, tmp_path):
    """Two hosts (two storage roots) naming the same state database have one trainer between them."""
    from core.config import StateConfig
    from tests.servers import unique_namespace

    state = {"dsn": pg_dsn, "namespace": unique_namespace()}
    lease = acquire_run_lock(StorageLayout(tmp_path / "host-a"), "run on host a", state)
    other = run_lock_for(StorageLayout(tmp_path / "host-b"), StateConfig.model_validate(state))
    try:
        with pytest.raises(RunLockBusy, match="run on host a"):
            other.acquire("run on host b", heartbeat=False)
    finally:
        lease.release()
    other.acquire("run on host b", heartbeat=False).release()
    other.close()


def test_a_lease_from_acquire_run_lock_closes_its_database_on_release(state_cfg, tmp_path):
    lease = acquire_run_lock(StorageLayout(tmp_path), "run", state_cfg, heartbeat=False)
    lease.release()
    lease.release()  # idempotent
    with pytest.raises(Exception, match="closed"):  # noqa: PT011 - sqlite3 / psycopg_pool say "closed"
        lease.lock.current()


def test_pid_alive_tells_running_exited_and_zombie_processes_apart():
    assert pid_alive(os.getpid())
    proc = subprocess.Popen(["true"])
    stat = Path(f"/proc/{proc.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)  # waiting for an external event (the child's exit), not for a race
    assert not pid_alive(proc.pid)  # exited, not yet reaped
    proc.wait()
    assert not pid_alive(proc.pid)
