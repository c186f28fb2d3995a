"""`TrainControl`: a tiny named actor per training run holding its stop flag and progress.

The control plane (or `TrainJob.request_stop`) sets the flag; rank 0 of the training loop polls it at
every step boundary and the workers stop together after the step in flight has been checkpointed,
published and committed. Progress (the last step's metrics) is pushed here so `status()` can be read
without touching Ray Train internals. Name: `TrainControl-<run_name>` (core/names.py `control_name`), in
the configured namespace (`ray.namespace`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from core.metrics import hold, zero_counter
from core.names import DEFAULT_NAMESPACE, control_name

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0, max_restarts=-1)
class TrainControl:
    def __init__(self) -> None:
        from ray.util import metrics

        self._stop = False
        self._steps: list[dict[str, Any]] = []
        self._state = "idle"
        self._since = time.time()
        # Exported from here (one per run) so the dashboard shows training without Ray Train internals.
        self._gauges = {  # the last step's values (train/step.py)
            "loss": metrics.Gauge("clawray_train_loss", "Last GRPO step: loss."),
            "reward_mean": metrics.Gauge("clawray_train_reward_mean", "Last GRPO step: mean reward of its batch."),
            "step_s": metrics.Gauge("clawray_train_step_s", "Last GRPO step: seconds."),
            "kl": metrics.Gauge("clawray_train_kl", "Last GRPO step: KL to the base model per token (0 unless "
                                                   "train.kl_coef > 0)."),
            "clip_frac": metrics.Gauge("clawray_train_clip_frac", "Last GRPO step: share of clipped tokens."),
            "tokens_trained": metrics.Gauge("clawray_train_tokens_trained", "Last GRPO step: tokens trained on."),
        }
        self._steps_total = zero_counter(metrics.Counter("clawray_train_steps_total", "GRPO steps completed."))

    def reset(self) -> None:
        """Called when a run (re)starts: a stop asked of a previous window must not stop this one. Only
        the holder of the run lock (train/run_lock.py) calls it, so no start resets a live run's flag."""
        self._stop, self._steps, self._state, self._since = False, [], "running", time.time()

    def request_stop(self) -> None:
        self._stop = True

    def should_stop(self) -> bool:
        return self._stop

    def record_step(self, metrics: dict[str, Any]) -> None:
        self._steps.append(metrics)
        for k, g in self._gauges.items():
            if isinstance(metrics.get(k), int | float):
                hold(g, float(metrics[k]))  # held: the last step's values stay exported after the run
        self._steps_total.inc()

    def set_state(self, state: str) -> None:
        self._state, self._since = state, time.time()

    def status(self) -> dict[str, Any]:
        return {
            "state": "stopping" if self._stop and self._state == "running" else self._state,
            "since": self._since,
            "steps": len(self._steps),
            "last": self._steps[-1] if self._steps else None,
        }

    def steps(self) -> list[dict[str, Any]]:
        return list(self._steps)


_HANDLES: dict[str, Any] = {}
# One lookup at a time in a process. Why: two threads of one process (the Controller's preload,
# cluster/trainer_preload.py, and a window's start) could both miss the cache; the second then got the
# first one's new actor by name, and Ray's handles got by name are weak (they do not keep an actor alive).
# Cached over the creator's handle, that let Ray end the actor under the run's next call ("all references
# to the actor were removed"), in a window resumed right after a Controller's restart.
_LOCK = threading.Lock()
REPLACE_TIMEOUT_S = 60.0  # how long a dead control actor may keep its name before get_control gives up


def get_control(run_name: str, namespace: str = DEFAULT_NAMESPACE, timeout_s: float = REPLACE_TIMEOUT_S):
    """Get or create the run's control actor, named in `namespace`. Not detached: it lives as long as the
    process that created it (a driver, or the Controller actor) keeps the handle cached here.

    NOTE: the cache matters: a non-detached actor dies when its last handle goes away, and a later
    `get_if_exists` could otherwise pick up the dying actor of a previous window. And the cache is checked:
    an actor dies with its owner, so a handle cached (or found by name) after another process created the
    actor, such as a Controller's previous incarnation, can be dead. Such a handle is dropped, and the name
    asked for again until Ray has freed it and a live actor answers (one round trip per call when alive;
    this runs once per training window).
    """
    key = f"{ray.get_runtime_context().get_job_id()}/{namespace}/{run_name}"  # handles die with their session
    with _LOCK:
        return _get_control(key, run_name, namespace, timeout_s)


def _get_control(key: str, run_name: str, namespace: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        handle = _HANDLES.get(key)
        if handle is None:
            handle = TrainControl.options(name=control_name(run_name), namespace=namespace,
                                          get_if_exists=True).remote()
        try:
            ray.get(handle.should_stop.remote(), timeout=max(1.0, deadline - time.monotonic()))
        except (RayActorError, GetTimeoutError):
            _HANDLES.pop(key, None)
            if time.monotonic() >= deadline:
                raise
            log.info("the control actor of run %r is gone (its owner died); asking for a new one", run_name)
            time.sleep(0.2)  # the dead actor may hold the name a moment longer
            continue
        _HANDLES[key] = handle
        return handle
