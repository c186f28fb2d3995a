"""The run's control actor after its owner died (train/control.py `get_control`).

A restarted Controller (or any process that cached a handle) must not keep a control actor whose owner is
gone: the actor dies with its owner, and a cached or looked-up handle to it would fail every later window
with ActorDiedError. The owner's death is driven by `ray.kill`, and the test waits until the old actor is
dead before asking again: no timing luck either way.
"""

from __future__ import annotations

import time
import uuid

import pytest
import ray

from train.control import get_control

pytestmark = pytest.mark.usefixtures("ray_cluster")


@ray.remote(num_cpus=0)
class _Owner:
    """Stands for a Controller incarnation: creates (and so owns) the run's control actor."""

    def make(self, run: str) -> str:
        handle = get_control(run, "clawray")
        ray.get(handle.reset.remote())
        return ray.get(handle.status.remote())["state"]


def _dead(handle) -> bool:
    try:
        ray.get(handle.status.remote(), timeout=10)
        return False
    except ray.exceptions.RayActorError:
        return True


def test_get_control_replaces_a_control_actor_whose_owner_died():
    run = f"ctl-{uuid.uuid4().hex[:8]}"
    owner = _Owner.remote()
    assert ray.get(owner.make.remote(run)) == "running"
    first = get_control(run, "clawray")  # the owner's actor, found by name (and cached here)
    assert ray.get(first.status.remote())["state"] == "running"
    ray.kill(owner, no_restart=True)  # the owner dies, so its control actor dies with it
    deadline = time.monotonic() + 60
    while not _dead(first):
        assert time.monotonic() < deadline, "the control actor outlived its owner"
        time.sleep(0.2)
    again = get_control(run, "clawray")
    assert ray.get(again.status.remote(), timeout=30)["state"] == "idle"  # a new, live actor
    ray.get(again.request_stop.remote())
    assert ray.get(get_control(run, "clawray").should_stop.remote())  # the new one stays cached


def test_get_control_keeps_a_live_actor():
    run = f"ctl-{uuid.uuid4().hex[:8]}"
    a = get_control(run, "clawray")
    ray.get(a.request_stop.remote())
    b = get_control(run, "clawray")
    assert ray.get(b.should_stop.remote())
    assert b is a  # the cached handle, checked alive, not a second actor


def test_the_controllers_preload_starts_the_control_actor_its_first_run_uses():
    """The Controller preloads the run's control actor (cluster/trainer_preload.py) where its name is free,
    so that its first window does not start that worker process; the run's own `get_control` then finds the
    same actor."""
    from cluster.trainer_preload import preload_trainer
    from core.names import control_name

    run = f"ctl-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError):
        ray.get_actor(control_name(run), namespace="clawray")
    preload_trainer(run, "clawray")
    preloaded = ray.get_actor(control_name(run), namespace="clawray")
    handle = get_control(run, "clawray")
    assert handle._actor_id == preloaded._actor_id
    assert ray.get(handle.status.remote())["state"] == "idle"


def test_the_preload_leaves_a_control_actor_of_another_owner_alone():
    """Where an actor holds the name (a killed Controller incarnation's, possibly dying with its owner), the
    preload neither takes nor caches it: the run asks `get_control` itself when it starts. Unconditional,
    the preload cached that actor, and a run right after a Controller's restart lost it under its first call
    (test_reliability.py's kill -9 sequence)."""
    from cluster.trainer_preload import _control_actor
    from train import control

    run = f"ctl-{uuid.uuid4().hex[:8]}"
    owner = _Owner.remote()
    assert ray.get(owner.make.remote(run)) == "running"
    cached = dict(control._HANDLES)
    assert _control_actor(run, "clawray") is False
    assert control._HANDLES == cached  # nothing of the other owner's cached here
    ray.kill(owner, no_restart=True)


def test_two_threads_asking_at_once_cache_the_handle_that_keeps_the_actor_alive(monkeypatch):
    """The Controller's preload thread and a window's start may ask for the same new control actor at once
    (a window resumed right after a Controller's restart). The interleaving that lost the actor, forced by a
    hook: B misses the cache, A creates the actor and caches its handle, then B asks Ray by name and gets
    a weak handle (handles got by name do not keep an actor alive) and cached it over A's, so the actor was
    ended under the run's next call ("all references to the actor were removed"). With get_control
    serialised, B waits for A (its hook times out: A cannot finish while B holds the lock) and either
    way the cache keeps the creator's handle."""
    import threading

    from train import control

    run = f"ctl-{uuid.uuid4().hex[:8]}"
    real, a_done, b_in = control.TrainControl, threading.Event(), threading.Event()

    class Hooked:
        @staticmethod
        def options(**kw):
            if threading.current_thread().name == "B":
                b_in.set()
                a_done.wait(5)  # B has missed the cache: let A create and cache first
            return real.options(**kw)

    monkeypatch.setattr(control, "TrainControl", Hooked)
    got: dict[str, object] = {}

    def ask(name: str) -> None:
        got[name] = control.get_control(run, "clawray")
        if name == "A":
            a_done.set()

    b = threading.Thread(target=ask, args=("B",), name="B")
    b.start()
    assert b_in.wait(30)
    a = threading.Thread(target=ask, args=("A",), name="A")
    a.start()
    a.join(60)
    b.join(60)
    assert got["A"]._actor_id == got["B"]._actor_id
    got.clear()  # as the preload does: only the cache holds a handle now
    key = f"{ray.get_runtime_context().get_job_id()}/clawray/{run}"
    assert control._HANDLES[key]._ray_original_handle  # the creator's: it keeps the actor alive
    assert ray.get(control._HANDLES[key].status.remote(), timeout=30)["state"] == "idle"
