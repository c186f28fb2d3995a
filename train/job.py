"""Starting the GRPO job: `run_training` (blocking), `TrainJob` (background, stoppable), and a CLI.

Ray Train V2: in Ray 2.60 `ray.train` picks V1 or V2 when it is first imported, from the env var
`RAY_TRAIN_V2_ENABLED` (default on in 2.60). We set it to 1 here before importing `ray.train` and refuse
to run on V1 (a process that imported `ray.train` with the variable at 0 keeps V1). Ray propagates the
variable from the driver to the Train controller and workers when it is set explicitly, so the whole
job runs V2; a cluster started with `RAY_TRAIN_V2_ENABLED=0` in its env must be restarted without it.

One trainer at a time: every run (the Controller's windows, `rl` and manual runs, this CLI) holds the
run lock (train/run_lock.py: the storage root's, or with `state.dsn` the state database's) while it
trains. A second start is refused with "a training run is already running since …" naming the holder
(this CLI then exits 2); a lock left by a killed holder is taken over once that holder's Ray Train
actors are gone.

    python -m train.job --config configs/local.yaml --steps 4 [--run-name grpo]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")  # before any `import ray.train` in this process

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402

from core import names  # noqa: E402
from core.blobs import checkpoint_storage, endpoint_env  # noqa: E402
from core.config import StateConfig, TrainConfig  # noqa: E402
from core.names import REPLAY as REPLAY_NAME  # noqa: E402
from core.storage import StorageLayout  # noqa: E402
from train.control import get_control  # noqa: E402
from train.grpo import train_loop_per_worker  # noqa: E402
from train.run_files import run_files  # noqa: E402
from train.run_lock import Holding, RunLease, RunLockBusy, acquire_run_lock  # noqa: E402

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parent.parent
PREVIOUS_RUN_TIMEOUT_S = 60.0  # how long a start waits for a dead lock holder's Ray Train actors to end
TRAIN_ACTOR_CLASSES = ("TrainController", "RayTrainWorker")  # Ray Train V2's controller and worker actors
CLOCK_SKEW_S = 5.0  # between the lock holder's clock and Ray's (GCS) start times of its actors


@dataclass
class TrainResult:
    run_name: str
    steps: list[dict[str, Any]]  # this invocation's step records (sample_ids, adapter, metrics)
    checkpoint: str | None  # latest checkpoint folder of the run
    stop_reason: str
    error: str | None = None
    adapters: list[str] = field(default_factory=list)
    discarded_steps: int = 0  # steps whose seal was refused (train/grpo.py): no update, nothing published

    @property
    def trained_sample_ids(self) -> list[str]:
        return [sid for s in self.steps for sid in s["sample_ids"]]


def _require_v2() -> None:
    from ray.train.v2._internal.constants import is_v2_enabled

    if not is_v2_enabled():
        raise RuntimeError(
            "Ray Train V2 is off (RAY_TRAIN_V2_ENABLED=0 when ray.train was imported); "
            "clawray's GRPO job needs V2: unset it or set it to 1 and restart the process"
        )


def build_trainer(cfg: TrainConfig, *, model_path: str, storage: StorageLayout, max_steps: int,
                  run_name: str, lease_s: float = 600.0, notify_serving: bool = True,
                  max_failures: int = 2, test_hooks: dict[str, str] | None = None,
                  namespace: str = names.DEFAULT_NAMESPACE):
    """A `TorchTrainer` for the GRPO loop (fixed or elastic workers from `cfg.num_workers`); its workers
    find the `Replay` and run control actors in `namespace`.

    `test_hooks` (tests only): {"before_seal": name of an actor rank 0 awaits before sealing a step}."""
    _require_v2()
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig
    from ray.train.v2._internal.constants import (
        ENABLE_PREEMPTION_WATCHER_ENV_VAR,
        HEALTH_CHECK_INTERVAL_S_ENV_VAR,
    )

    # Ray Train V2 takes these settings only from the environment of the process that calls `fit` (it
    # passes them on to its controller actor), so the config's values are put there.
    os.environ[HEALTH_CHECK_INTERVAL_S_ENV_VAR] = repr(cfg.health_check_interval_s)
    os.environ[ENABLE_PREEMPTION_WATCHER_ENV_VAR] = "1" if cfg.preemption_watcher else "0"

    workers = cfg.num_workers if isinstance(cfg.num_workers, int) else tuple(cfg.num_workers)
    # The same bundle the Controller asks the autoscaler for (TrainConfig.worker_bundle).
    scaling = ScalingConfig(num_workers=workers, use_gpu=cfg.use_gpu, resources_per_worker=cfg.worker_bundle())
    # Checkpoints go where the storage root is: its local folder, or its bucket (`storage_root: s3://`)
    # through a filesystem that reaches the same endpoint as the blobs (core/blobs.py).
    storage_path, storage_fs = checkpoint_storage(storage)
    run = RunConfig(
        name=run_name,
        storage_path=storage_path,
        storage_filesystem=storage_fs,
        # Workers (rank 0 publishes adapters there too) reach the bucket through the driver's endpoint.
        worker_runtime_env={"env_vars": endpoint_env()} if storage.blob_root else None,
        failure_config=FailureConfig(max_failures=max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=2),  # resume needs only the latest
    )
    loop_config = {
        "train": cfg.model_dump(mode="json"), "model_path": model_path, "storage_root": str(storage.root),
        "blob_root": storage.blob_root,
        "run_name": run_name, "max_steps": max_steps, "lease_s": lease_s, "notify_serving": notify_serving,
        "test_hooks": dict(test_hooks or {}), "namespace": namespace,
    }
    return trainer_class()(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=scaling,
        run_config=run,
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
    )


def trainer_class() -> type:
    """Ray Train's `TorchTrainer` with two of its default callbacks adjusted for runs that start and end
    every window (Ray Train has no option for either; the override keeps Ray's list of default callbacks
    otherwise as it is):

    - less Ray Data's callback when a run has no datasets (the GRPO loop leases its batches from the
      Replay actor and never has any). That callback starts a `DatasetManager` actor in every run whether
      or not there are datasets: one more process spawned per window, which imports Ray Data while the
      training worker starts on the same cores (benchmarks/window_efficiency.py). Without it the workers'
      train context has no dataset shard provider, which only `ray.train.get_dataset_shard` reads.
    - the placement-group cleaner told to stop without waiting for it (`NoWaitCleanerCallback`)."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    class NoWaitCleanerCallback(PlacementGroupCleanerCallback):
        """Ray's placement-group cleaner (a detached actor per run that removes the run's placement group
        if the Train controller dies without doing so), told to stop at a graceful shutdown without the
        controller waiting for it. Ray's callback waits for the cleaner's monitor thread, which notices
        the stop only after its current poll of up to 1 s (`check_interval_s`): on average ~0.5 s of every
        window's tail. Not waiting loses nothing: the controller has removed the placement group itself by
        then, and a cleaner that has not stopped yet sees the controller gone, finds the group removed and
        exits. An abort still waits, as Ray's does."""

        async def before_controller_shutdown(self) -> None:
            cleaner, self._cleaner = self._cleaner, None
            if cleaner is not None:
                cleaner.stop.remote()

    class GRPOTrainer(TorchTrainer):
        def _create_default_callbacks(self) -> list:
            callbacks = [NoWaitCleanerCallback() if type(c) is PlacementGroupCleanerCallback else c
                         for c in super()._create_default_callbacks()]
            if self.datasets:
                return callbacks
            return [c for c in callbacks if not isinstance(c, DatasetsCallback)]

    return GRPOTrainer


def take_run_lock(storage: StorageLayout, holder: str, state: StateConfig | dict | None = None) -> RunLease:
    """Take the run lock (train/run_lock.py) for `holder`, or raise `RunLockBusy`: the storage root's, or
    with `state.dsn` the state database's, which every host shares."""
    info = {"ray_job": ray.get_runtime_context().get_job_id()} if ray.is_initialized() else {}
    return acquire_run_lock(storage, holder, state, info=info)


def _live_train_actors(holding: Holding) -> list[str]:
    """Ray Train actors that `holding`'s holder started while it held the lock and that are not dead
    yet, from the GCS actor table (Ray's own accessor: `ray.util.state` goes through the dashboard, which
    the embedded default does not run). Older actors of the same Ray job belong to runs that ended and
    gave the lock back (a driver keeps its last idle Train controller alive)."""
    from ray._private.state import actors

    table = actors(job_id=ray.JobID.from_hex(holding.info["ray_job"]))
    since_ms = (holding.since - CLOCK_SKEW_S) * 1000
    return [a["ActorID"] for a in table.values()
            if a["ActorClassName"] in TRAIN_ACTOR_CLASSES and a["State"] != "DEAD"
            and (a["StartTime"] == 0 or a["StartTime"] >= since_ms)]  # 0: not started yet


def await_previous_run_gone(previous: Holding | None) -> None:
    """After taking the run lock over from a dead holder, wait until its Ray Train actors are dead too.

    Ray ends a dead process's actors (its Train controller, then that one's workers) asynchronously; a
    worker still in its step could commit a lease that this run's recovery is about to release, or
    publish an adapter after ours. Raises RuntimeError when they outlive `PREVIOUS_RUN_TIMEOUT_S`.
    """
    if previous is None or not previous.info.get("ray_job") or not ray.is_initialized():
        return  # the lock was free, or its holder ran without Ray
    deadline = time.monotonic() + PREVIOUS_RUN_TIMEOUT_S
    while alive := _live_train_actors(previous):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the run lock was taken over from {previous.describe()}, but {len(alive)} Ray Train "
                f"actor(s) of its job are still alive after {PREVIOUS_RUN_TIMEOUT_S:.0f} s: {', '.join(alive[:4])}"
            )
        time.sleep(0.5)


def _require_replay(namespace: str) -> None:
    try:  # fail fast here (one try): inside the trainer a missing actor would be retried as a worker failure
        names.actor(REPLAY_NAME, namespace, timeout_s=0, fresh=True)
    except ValueError as e:
        raise RuntimeError(
            f"no {REPLAY_NAME!r} actor in namespace {namespace!r}: start it first "
            "(train.replay.get_or_create_replay)"
        ) from e


def run_training(cfg: TrainConfig, *, model_path: str, storage: StorageLayout, max_steps: int | None = None,
                 run_name: str = "grpo", lease_s: float = 600.0, notify_serving: bool = True,
                 control=None, test_hooks: dict[str, str] | None = None, lease: RunLease | None = None,
                 holder: str = "python -m train.job", state: StateConfig | dict | None = None,
                 namespace: str = names.DEFAULT_NAMESPACE) -> TrainResult:
    """Train until stopped, out of fresh samples, or `max_steps` (default `cfg.max_steps_per_window`).

    Needs `ray.init` done and the `Replay` actor running. Re-running with the same `run_name` and
    storage resumes from the run's latest checkpoint.

    One trainer at a time: the run holds the storage root's run lock from before its trainer starts
    until it has ended. While another run holds it, this raises `RunLockBusy` ("a training run is already
    running since …", naming that run) and touches nothing: not the run's control actor, not a Replay
    lease. That is what makes the recovery every run starts with (rank 0 releases every open lease
    owned by `run_name`) safe: the only other leases under that name are a dead run's. `lease`: the lock,
    already taken by the caller (`TrainJob.start`, so a refused start is answered at once); it is given
    back here either way. `state`: the config's `state` section (where the run lock lives). `namespace`:
    the Ray namespace of the `Replay` actor and of the run's control actor (`ray.namespace`).
    """
    storage.ensure()
    lease = lease or take_run_lock(storage, f"{holder} (run {run_name!r})", state)
    try:
        _require_replay(namespace)
        await_previous_run_gone(lease.previous)
        if control is None:  # TrainJob passes its own, reset once it held the lock
            control = get_control(run_name, namespace)
            ray.get(control.reset.remote())
        lease.on_lost(control.request_stop.remote)  # taken over after a stall: stop at the next boundary
        return _train(cfg, control, model_path=model_path, storage=storage, max_steps=max_steps,
                      run_name=run_name, lease_s=lease_s, notify_serving=notify_serving, test_hooks=test_hooks,
                      namespace=namespace)
    finally:
        lease.release()


def _train(cfg: TrainConfig, control, *, model_path: str, storage: StorageLayout, max_steps: int | None,
           run_name: str, lease_s: float, notify_serving: bool,
           test_hooks: dict[str, str] | None, namespace: str = names.DEFAULT_NAMESPACE) -> TrainResult:
    """The run itself, under the run lock: build the trainer, fit, read back what it did (from the run's
    records, which rank 0 wrote wherever it ran: train/run_files.py)."""
    files = run_files(storage, run_name)
    seen, seen_discards = files.steps.count(), files.discards.count()
    steps = max_steps if max_steps is not None else cfg.max_steps_per_window
    trainer = build_trainer(cfg, model_path=model_path, storage=storage, max_steps=steps,
                            run_name=run_name, lease_s=lease_s, notify_serving=notify_serving,
                            test_hooks=test_hooks, namespace=namespace)
    error = None
    try:
        result = trainer.fit()
        checkpoint = result.checkpoint.path if result.checkpoint else None
    except Exception as e:  # noqa: BLE001 - any training failure is reported to the caller as data
        error, checkpoint = f"{type(e).__name__}: {e}", None
    done = files.steps.read(seen)
    discarded = files.discards.count() - seen_discards
    stopped = ray.get(control.should_stop.remote())
    reason = ("error" if error else "stop_requested" if stopped
              else "max_steps" if len(done) + discarded >= steps else "no_fresh_samples")
    ray.get(control.set_state.remote("failed" if error else "finished"))
    return TrainResult(run_name=run_name, steps=done, checkpoint=checkpoint, stop_reason=reason,
                       error=error, adapters=[s["adapter"] for s in done], discarded_steps=discarded)


class TrainJob:
    """A training window run in a background thread; usable from the Controller actor.

    `start()` returns at once; `request_stop()` makes the job stop at the next step boundary;
    `status()` is cheap; `wait()` returns the `TrainResult`.
    """

    def __init__(self, cfg: TrainConfig, *, model_path: str, storage: StorageLayout,
                 run_name: str = "grpo", max_steps: int | None = None, lease_s: float = 600.0,
                 notify_serving: bool = True, holder: str = "TrainJob",
                 state: StateConfig | dict | None = None, namespace: str = names.DEFAULT_NAMESPACE,
                 test_hooks: dict[str, str] | None = None) -> None:
        self._kwargs = dict(model_path=model_path, storage=storage, max_steps=max_steps, run_name=run_name,
                            lease_s=lease_s, notify_serving=notify_serving, namespace=namespace,
                            test_hooks=test_hooks)
        self._state = state
        self._cfg, self.run_name = cfg, run_name
        self._holder = f"{holder} (run {run_name!r})"
        self._thread: threading.Thread | None = None
        self._result: TrainResult | None = None
        self._control = None

    def start(self) -> None:
        """Take the run lock, then start the run in a thread. Raises `RunLockBusy` while any run holds the
        lock (this job's own run included), before touching the run's control actor."""
        lease = take_run_lock(self._kwargs["storage"], self._holder, self._state)
        try:
            self._control = get_control(self.run_name, self._kwargs["namespace"])
            ray.get(self._control.reset.remote())  # before the thread: a stop requested now must count
        except BaseException:
            lease.release()
            raise
        self._result = None
        self._thread = threading.Thread(target=self._run, args=(lease,), name=f"train-{self.run_name}",
                                        daemon=True)
        self._thread.start()

    def _run(self, lease: RunLease) -> None:
        try:
            self._result = run_training(self._cfg, control=self._control, lease=lease, **self._kwargs)
        except Exception as e:  # noqa: BLE001 - a run that could not start (no Replay actor, ...) is data too
            log.exception("training run %r failed", self.run_name)
            self._result = TrainResult(run_name=self.run_name, steps=[], checkpoint=None, stop_reason="error",
                                       error=f"{type(e).__name__}: {e}")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def request_stop(self) -> None:
        if self._control is not None:
            ray.get(self._control.request_stop.remote())

    def status(self) -> dict[str, Any]:
        if self._control is None:
            return {"state": "idle", "steps": 0, "last": None}
        st = ray.get(self._control.status.remote())
        if self._result is not None:
            st.update(stop_reason=self._result.stop_reason, error=self._result.error)
        return st

    def wait(self, timeout: float | None = None) -> TrainResult | None:
        if self._thread is not None:
            self._thread.join(timeout)
        return self._result


def main(argv: list[str] | None = None) -> int:
    """CLI: train up to --steps steps on the Replay buffer of the configured storage root."""
    from core.config import load_config
    from train.replay import get_or_create_replay

    p = argparse.ArgumentParser(prog="python -m train.job", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="config YAML (default $CLAWRAY_CONFIG or configs/local.yaml)")
    p.add_argument("--steps", type=int, default=None, help="max steps (default train.max_steps_per_window)")
    p.add_argument("--run-name", default="grpo", help="Ray Train run name; the same name resumes")
    p.add_argument("--no-serve", action="store_true", help="publish adapters without telling serving")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    cfg = load_config(args.config)
    local = cfg.ray.address is None  # config: None = start a local cluster (never join a stray one)
    ray.init(
        address="local" if local else cfg.ray.address, namespace=cfg.ray.namespace,
        num_cpus=cfg.ray.num_cpus if local else None,
        include_dashboard=cfg.ray.include_dashboard,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}},  # workers import core/ and train/
    )
    storage = StorageLayout(cfg.storage_path(), blob_root=cfg.blob_root()).ensure()
    # Keep the handle: the actor lives while it is held.
    replay = get_or_create_replay(cfg.replay, storage, state=cfg.state.model_dump(), namespace=cfg.ray.namespace)
    ray.get(replay.stats.remote())
    try:
        result = run_training(
            cfg.train, model_path=cfg.model_path(), storage=storage, max_steps=args.steps,
            run_name=args.run_name, lease_s=cfg.replay.lease_timeout_s, notify_serving=not args.no_serve,
            state=cfg.state, namespace=cfg.ray.namespace,
        )
    except RunLockBusy as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = asdict(result)
    summary["steps"] = [{k: v for k, v in s.items() if k != "sample_ids"} for s in result.steps]
    print(json.dumps(summary, indent=2, default=str))
    return 1 if result.error else 0


if __name__ == "__main__":
    raise SystemExit(main())
