"""Preloading the trainer in the Controller's process, at its start, so the first window does not pay for it.

What the first run would otherwise start: the training job's modules (`train.job`: Ray Train, torch, the
GRPO loop; ~2-3 s on 2 cores, imported inside the Controller's `_start` on the actor's event loop, so every
other call to the Controller stalled meanwhile) and Ray's cluster-wide autoscaling coordinator (~1.7 s).
Both were costs of the first window only (benchmarks/window_efficiency.py, cold). A window opening
meanwhile waits for the same import (Python's per-module import lock) and finds the same actor (Ray's
accessor is get-or-create).

Not the run's control actor (train/control.py): a Controller restarted after a crash would find, at its
start, the control actor of its killed incarnation by name while that actor is still dying with its owner
(seen in test_controller_windows.py). `get_control` now replaces such an actor (tests/integration/
test_train_control.py), but only after it has died; the run creates its control actor when it starts.
Preloading it was tried again (2026-12-05, ~0.7 s of the cold window) and reverted: in
test_reliability.py's kill -9 sequence a manual run started right after the Controller's restart found the
actor live, then had it die under its first call ("could not start: ActorDiedError ... TrainControl").
"""

from __future__ import annotations

import importlib
import logging
import time

import ray

log = logging.getLogger("clawray.controller")


def preload_trainer() -> None:
    """Import the training job's modules, then (with Ray up) start Ray's autoscaling coordinator. Never
    raises: what fails here fails again in the run, where it is reported."""
    t0 = time.perf_counter()
    try:
        importlib.import_module("train.job")
        if ray.is_initialized():  # not in unit tests that build the actor without Ray
            _autoscaling_coordinator()
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
