"""`train/run_lock.py`: one trainer per storage root, across threads and processes (issue 12 item 3).

Races are driven by barriers and events (threads released together, a child process that holds the lock
until told), never by sleeps; expiry is driven by an injected clock.
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

from train.run_lock import RunLock, RunLockBusy, pid_alive


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_of_racing_starts_exactly_one_holds_the_lock_and_the_others_are_told_who(tmp_path):
    path, n = tmp_path / "run_lock.db", 8
    barrier = threading.Barrier(n)
    won: list = []
    refused: list[RunLockBusy] = []

    def start(i: int) -> None:
        lock = RunLock(path)
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
    assert RunLock(path).current() is None


def _hold(path: str, held, done) -> None:
    """Child process: take the lock, say so, hold it until told (or killed)."""
    lease = RunLock(path).acquire("python -m train.job run 'grpo'")
    held.set()
    done.wait(60)
    lease.release()


@pytest.fixture
def child_holding(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    held, done = ctx.Event(), ctx.Event()
    path = tmp_path / "run_lock.db"
    proc = ctx.Process(target=_hold, args=(str(path), held, done), daemon=True)
    proc.start()
    assert held.wait(60), "the child never took the lock"
    yield path, proc, done
    # NOTE: only a live child may be told: setting a multiprocessing Event whose waiter was SIGKILLed
    # blocks for ever (its Condition waits for the dead sleeper to wake).
    if proc.is_alive():
        done.set()
        proc.join(30)


def test_a_lock_held_by_another_process_refuses_then_frees_on_release(child_holding):
    path, proc, done = child_holding
    with pytest.raises(RunLockBusy, match=rf"already running since .*python -m train.job.*pid {proc.pid}"):
        RunLock(path).acquire("Controller manual run 1", heartbeat=False)
    done.set()
    proc.join(30)
    lease = RunLock(path).acquire("Controller manual run 1", heartbeat=False)
    assert lease.previous is None  # given back, not taken over
    lease.release()


def test_a_killed_holder_on_this_host_is_taken_over_at_once(child_holding):
    path, proc, _ = child_holding
    os.kill(proc.pid, signal.SIGKILL)  # a Controller killed mid-run: no release, lease not expired
    proc.join(30)
    lease = RunLock(path).acquire("restarted Controller", heartbeat=False)
    assert lease.previous is not None and lease.previous.pid == proc.pid
    assert lease.previous.holder == "python -m train.job run 'grpo'"
    lease.release()


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew_or_release_it(tmp_path):
    clock = Clock()
    lock = RunLock(tmp_path / "l.db", ttl_s=60, clock=clock)
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


def test_a_holder_whose_lease_was_taken_over_is_told_to_stop(tmp_path):
    path = tmp_path / "l.db"
    lease = RunLock(path, ttl_s=0.03).acquire("stalled run")  # heartbeat every 10 ms
    told = threading.Event()
    lease.on_lost(told.set)
    # Another process judges the holder dead (its pid gone) and takes over; the next renewal fails.
    RunLock(path, is_alive=lambda pid: False).acquire("new run", heartbeat=False)
    assert told.wait(30) and lease.lost.is_set()
    lease.release()
    assert RunLock(path).current().holder == "new run"


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
