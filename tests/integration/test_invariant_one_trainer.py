"""Invariant: one trainer at a time (issue 12 item 3), on a real local Ray cluster.

Two `run_training` calls on one storage root (what the Controller's `TrainJob` and `python -m train.job`
both call) never train at once: the second is refused with "a training run is already running since …"
naming the first, before it touches the run's control actor or any Replay lease. So a run's recovery
(`Replay.release_owner(run_name)`, what rank 0 does first) never frees the lease of a live run.

The trainer is a stand-in built by a patched `build_trainer`: its `fit()` does what a GRPO run does to
Replay first (rank 0's recovery: `release_owner`; then lease a batch) and, for the first run, waits on an
event inside its step, so the second start happens exactly while the first run holds a lease. The real
Ray Train path is covered by test_train_job.py; this module is about who may start one. The `Replay`
actor is this module's own, under its own name, so it never meets the system's.
"""

from __future__ import annotations

import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from core.config import LoRAConfig, ReplayConfig, TrainConfig
from core.contracts import Sample
from core.storage import StorageLayout

pytestmark = pytest.mark.slow

RUN = "grpo"  # every Controller run has this name: the case where recovery could hit another run
REPLAY = "Replay-one-trainer"


class FakeTrainer:
    """What `build_trainer` returns here: recovery + one leased step, optionally held open."""

    def __init__(self, replay, run_name: str, hold: threading.Event | None) -> None:
        self.replay, self.run_name, self.hold = replay, run_name, hold
        self.in_step = threading.Event()
        self.lease_id: str | None = None

    def fit(self):
        import ray

        ray.get(self.replay.release_owner.remote(self.run_name))  # rank 0's recovery
        self.lease_id, _ = ray.get(self.replay.lease.remote(4, 600.0, self.run_name, 1))
        self.in_step.set()
        if self.hold is not None:
            assert self.hold.wait(120), "the test never let the first run finish"
        ray.get(self.replay.commit.remote(self.lease_id))
        return SimpleNamespace(checkpoint=None)


@pytest.fixture
def env(ray_cluster, tmp_path, monkeypatch):
    import train.job
    from train.replay import Replay

    ray = ray_cluster
    storage = StorageLayout(tmp_path / "state").ensure()
    replay = Replay.options(name=REPLAY, namespace="clawray").remote(ReplayConfig(), str(storage.replay))
    ray.get(replay.append.remote([
        Sample(session_id=f"s{i}", turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4],
               response_logprobs=[-1.0, -1.0], reward=1.0, loss_mask=[1, 1], skill_generation=0)
        for i in range(16)]))
    built: list[FakeTrainer] = []
    holds: list[threading.Event | None] = []

    def build(cfg, *, run_name, **kw):
        built.append(FakeTrainer(replay, run_name, holds.pop(0) if holds else None))
        return built[-1]

    monkeypatch.setattr(train.job, "REPLAY_NAME", REPLAY)
    monkeypatch.setattr(train.job, "build_trainer", build)
    cfg = TrainConfig(num_workers=1, batch_size=4, min_fresh_samples=1, lora=LoRAConfig(rank=4, alpha=8))
    yield SimpleNamespace(ray=ray, storage=storage, replay=replay, cfg=cfg, built=built, holds=holds)
    ray.kill(replay)


def run(env, **kw):
    from train.job import run_training

    return run_training(env.cfg, model_path="unused", storage=env.storage, run_name=RUN, max_steps=1, **kw)


def test_two_concurrent_runs_never_train_at_once_and_recovery_never_frees_a_live_runs_lease(env):
    from train.run_lock import RunLockBusy, run_lock_for

    hold = threading.Event()
    env.holds.append(hold)
    first: dict = {}
    a = threading.Thread(target=lambda: first.update(result=run(env)))
    a.start()
    try:
        while not env.built:  # the first run reaches its trainer (bounded by the join below)
            a.join(0.05)
            assert a.is_alive() or env.built, "the first run ended before its trainer started"
        assert env.built[0].in_step.wait(120)
        leased = env.ray.get(env.replay.stats.remote())["by_state"].get("leased", 0)
        assert leased == 4  # the first run is inside its step, holding its lease

        with pytest.raises(RunLockBusy) as refused:
            run(env)  # a second start while the first trains: the CLI, a window, a train-step
        msg = str(refused.value)
        assert msg.startswith("a training run is already running since ")
        assert "python -m train.job" in msg and f"run {RUN!r}" in msg
        assert len(env.built) == 1  # no second trainer
        by_state = env.ray.get(env.replay.stats.remote())["by_state"]
        assert by_state.get("leased", 0) == 4  # the live run's lease was not released by a recovery
    finally:
        hold.set()
        a.join(120)
    assert first["result"].error is None
    assert run_lock_for(env.storage).current() is None  # given back when the run ended

    second = run(env)  # now it may start
    assert second.error is None and len(env.built) == 2


class RayTrainWorker:
    """Named as Ray Train V2 names its worker actors: stands in for a dead holder's surviving worker."""

    def ping(self) -> bool:
        return True


def plant_stale_holding(storage, job_id: str, since: float) -> None:
    """The lock row a killed holder leaves: its pid no longer runs; its Ray job is `job_id`; it took the
    lock at `since` (before it started its Ray Train actors)."""
    from train.run_lock import run_lock_for

    dead = subprocess.Popen(["true"])
    dead.wait()
    lock = run_lock_for(storage)
    lease = lock.acquire("Controller window run 7 (run 'grpo')", heartbeat=False, info={"ray_job": job_id})
    with lock.db.tx() as c:
        c.execute("UPDATE run_lock SET pid = ?, since = ? WHERE token = ?", (dead.pid, since, lease.holding.token))
    lock.close()


def test_a_run_taking_over_a_dead_holders_lock_waits_until_its_train_actors_are_gone(env, monkeypatch):
    import train.job
    from train.run_lock import RunLockBusy, run_lock_for

    ray = env.ray
    job_id, since = ray.get_runtime_context().get_job_id(), time.time()
    plant_stale_holding(env.storage, job_id, since)
    survivor = ray.remote(num_cpus=0)(RayTrainWorker).remote()
    assert ray.get(survivor.ping.remote())
    monkeypatch.setattr(train.job, "PREVIOUS_RUN_TIMEOUT_S", 1.0)

    with pytest.raises(RuntimeError, match="still alive") as e:
        run(env)  # the lock is free to take, but the dead run's worker could still commit its lease
    assert not isinstance(e.value, RunLockBusy) and env.built == []
    assert run_lock_for(env.storage).current() is None  # given back: the next start may try again

    plant_stale_holding(env.storage, job_id, since)
    ray.kill(survivor)  # asynchronous: the next run waits until Ray's actor table shows it dead
    monkeypatch.setattr(train.job, "PREVIOUS_RUN_TIMEOUT_S", 60.0)
    assert run(env).error is None and len(env.built) == 1
    assert run_lock_for(env.storage).current() is None
