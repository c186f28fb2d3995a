"""Preloading the trainer in the Controller's process, at its start, so the first window does not pay for it.

What the first run would otherwise start: the training job's modules (`train.job`: Ray Train, torch, the
GRPO loop; ~2-3 s on 2 cores, imported inside the Controller's `_start` on the actor's event loop, so every
other call to the Controller stalled meanwhile) and Ray's cluster-wide autoscaling coordinator (~1.7 s).
Both were costs of the first window only (benchmarks/window_efficiency.py, cold). A window opening
meanwhile waits for the same import (Python's per-module import lock) and finds the same actors (Ray's
accessors are get-or-create).

And the run's control actor (train/control.py, ~0.7 s of the cold window: a worker process of its own),
but only where no actor holds its name. A Controller restarted after a crash (or started while its killed
predecessor's actors are being ended) may find the control actor of its killed incarnation by name while
that actor is still dying with its owner: alive when asked, dead under its next call. With the name free,
the actor created here is owned by this Controller and nothing of a previous incarnation can be picked up;
with the name taken, the preload leaves it to the run, which asks `get_control` as before. An
unconditional preload was tried and reverted (test_reliability.py's kill -9 sequence: a manual run right
after the Controller's restart had the actor die under its first call). That run may also have met the
race found later, with the same error: this thread and the run asking `get_control` at once, the run
caching a weak by-name handle over the creator's (now serialised, train/control.py `_LOCK`).
"""

from __future__ import annotations

import importlib
import logging
import time

import ray

log = logging.getLogger("clawray.controller")


def preload_trainer(run_name: str | None = None, namespace: str | None = None) -> None:
    """Import the training job's modules, then (with Ray up) start Ray's autoscaling coordinator and,
    given `run_name` and `namespace`, the run's control actor where no actor holds its name. Never raises:
    what fails here fails again in the run, where it is reported."""
    t0 = time.perf_counter()
    try:
        importlib.import_module("train.job")
        if ray.is_initialized():  # not in unit tests that build the actor without Ray
            _autoscaling_coordinator()
            if run_name is not None and namespace is not None:
                _control_actor(run_name, namespace)
    except Exception:  # noqa: BLE001 - the run that needs them raises the same error where it is reported
        log.exception("preloading the trainer failed")
        return
    log.info("trainer preloaded in %.1f s", time.perf_counter() - t0)


def _autoscaling_coordinator() -> None:
    """Start Ray's cluster-wide autoscaling coordinator, a detached actor that Ray Train's scaling policy
    creates in the first run of a cluster (~1.7 s of the cold window here), through Ray's own accessor.
    Private to Ray: where a Ray release moves it, the first run creates it as before."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:
        return
    ray.get(get_or_create_autoscaling_coordinator().__ray_ready__.remote())


def _control_actor(run_name: str, namespace: str) -> bool:
    """Create the run's control actor through `get_control` (which caches its handle for the run), unless
    an actor already holds its name: one of a previous incarnation may be dying with its owner. Returns
    whether it was created here."""
    from core.names import control_name
    from train.control import get_control

    try:
        ray.get_actor(control_name(run_name), namespace=namespace)
    except ValueError:  # no such actor (a dead one's name is free again)
        get_control(run_name, namespace)
        return True
    log.info("the control actor of run %r exists already; the run will ask for it", run_name)
    return False
