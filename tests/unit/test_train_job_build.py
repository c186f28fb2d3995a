"""Building the TorchTrainer from TrainConfig (no cluster needed): scaling, run config, V2."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import TrainConfig
from core.storage import StorageLayout


@pytest.mark.parametrize("workers", [2, (1, 3)])
def test_build_trainer_fixed_or_elastic_workers(tmp_path: Path, workers) -> None:
    from train.job import build_trainer

    cfg = TrainConfig(num_workers=workers, cpus_per_worker=0.5)
    trainer = build_trainer(cfg, model_path="m", storage=StorageLayout(tmp_path), max_steps=3, run_name="r")
    scaling = trainer.scaling_config
    assert scaling.num_workers == workers and scaling.resources_per_worker == {"CPU": 0.5}
    assert trainer.run_config.name == "r"
    assert Path(trainer.run_config.storage_path) == tmp_path / "checkpoints"
    assert trainer.train_loop_config["max_steps"] == 3
    assert not trainer.run_config.worker_runtime_env  # a local root: nothing to pass on


def test_train_v2_is_enabled_by_importing_train_job() -> None:
    import importlib
    import os

    importlib.import_module("train.job")  # first: it sets the flag before ray.train is imported
    from ray.train.v2._internal.constants import is_v2_enabled

    assert os.environ["RAY_TRAIN_V2_ENABLED"] == "1" and is_v2_enabled()


def test_elastic_workers_from_yaml_list() -> None:
    cfg = TrainConfig.model_validate({"num_workers": [1, 4]})
    assert tuple(cfg.num_workers) == (1, 4)


def test_checkpoints_go_to_the_object_storage_root(tmp_path: Path, s3_endpoint: str, monkeypatch) -> None:
    """With `storage_root: s3://...` Ray Train gets the bucket's `checkpoints/` prefix on a filesystem that
    reaches the configured endpoint, and the workers get the blob root (they publish adapters there)."""
    import pyarrow.fs

    from train.job import build_trainer

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    layout = StorageLayout(tmp_path, blob_root="s3://bkt/team")
    trainer = build_trainer(TrainConfig(), model_path="m", storage=layout, max_steps=1, run_name="r")
    assert trainer.run_config.storage_path == "bkt/team/checkpoints"  # prefix-stripped: fs given
    assert isinstance(trainer.run_config.storage_filesystem, pyarrow.fs.FileSystem)
    assert trainer.train_loop_config["blob_root"] == "s3://bkt/team"
    # the endpoint (not a secret) follows the workers to nodes added later; credentials never do
    assert trainer.run_config.worker_runtime_env == {"env_vars": {"AWS_ENDPOINT_URL_S3": s3_endpoint}}


def test_the_controllers_poll_interval_comes_from_the_config(tmp_path: Path, monkeypatch) -> None:
    """Ray Train reads its health-check interval from the env of the process that calls `fit` (and passes
    it to its controller actor): the trainer's builder puts the config's value there."""
    from ray.train.v2._internal.constants import HEALTH_CHECK_INTERVAL_S_ENV_VAR, get_env_vars_to_propagate

    from train.job import build_trainer

    monkeypatch.delenv(HEALTH_CHECK_INTERVAL_S_ENV_VAR, raising=False)
    build_trainer(TrainConfig(health_check_interval_s=0.5), model_path="m", storage=StorageLayout(tmp_path),
                  max_steps=1, run_name="r")
    assert get_env_vars_to_propagate()[HEALTH_CHECK_INTERVAL_S_ENV_VAR] == "0.5"
    with pytest.raises(ValueError):
        TrainConfig(health_check_interval_s=0)


@pytest.mark.parametrize("on", [True, False])
def test_the_preemption_watcher_follows_the_config(tmp_path: Path, monkeypatch, on: bool) -> None:
    """The same way for Ray Train's preemption watcher (one actor process per run): off in
    configs/local.yaml, where there is no spot node to watch."""
    from ray.train.v2._internal.constants import ENABLE_PREEMPTION_WATCHER_ENV_VAR, get_env_vars_to_propagate

    from core.config import load_config
    from train.job import build_trainer

    monkeypatch.delenv(ENABLE_PREEMPTION_WATCHER_ENV_VAR, raising=False)
    build_trainer(TrainConfig(preemption_watcher=on), model_path="m", storage=StorageLayout(tmp_path),
                  max_steps=1, run_name="r")
    assert get_env_vars_to_propagate()[ENABLE_PREEMPTION_WATCHER_ENV_VAR] == ("1" if on else "0")
    assert load_config(Path(__file__).resolve().parents[2] / "configs" / "local.yaml").train.preemption_watcher is False


def test_a_run_without_datasets_starts_no_dataset_manager(tmp_path: Path) -> None:
    """Ray Data's callback starts a DatasetManager actor (a process importing Ray Data) in every run; the
    GRPO loop has no datasets, so the trainer leaves that callback out and keeps Ray's others."""
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from train.job import build_trainer

    trainer = build_trainer(TrainConfig(), model_path="m", storage=StorageLayout(tmp_path), max_steps=1, run_name="r")
    callbacks = trainer._create_default_callbacks()
    assert DatasetsCallback not in [type(c) for c in callbacks]
    assert any(isinstance(c, PlacementGroupCleanerCallback) for c in callbacks)
    trainer.datasets = {"rows": object()}  # a run that has datasets keeps the callback
    assert DatasetsCallback in [type(c) for c in trainer._create_default_callbacks()]


def test_the_placement_group_cleaner_is_told_to_stop_without_waiting(tmp_path: Path, monkeypatch) -> None:
    """Ray's callback waits at every graceful shutdown for its cleaner actor's monitor thread, which notices
    the stop only after its current poll of up to 1 s: ~0.5 s of every window's tail on average
    (benchmarks/window_efficiency.py). The trainer's callback sends the stop and does not wait; the other
    default callbacks and an abort are as Ray has them."""
    import asyncio

    import ray
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from train.job import build_trainer

    trainer = build_trainer(TrainConfig(), model_path="m", storage=StorageLayout(tmp_path), max_steps=1, run_name="r")
    callbacks = trainer._create_default_callbacks()
    (cleaner_cb,) = [c for c in callbacks if isinstance(c, PlacementGroupCleanerCallback)]
    calls: list[str] = []

    class Stop:
        @staticmethod
        def remote() -> str:
            calls.append("stop")
            return "ref"

    class Cleaner:
        stop = Stop

    monkeypatch.setattr(ray, "get", lambda *a, **k: calls.append("get"))
    cleaner_cb._cleaner = Cleaner()
    asyncio.run(cleaner_cb.before_controller_shutdown())
    assert calls == ["stop"] and cleaner_cb._cleaner is None  # sent, not waited for
    cleaner_cb._cleaner = Cleaner()
    cleaner_cb.before_controller_abort()
    assert calls == ["stop", "stop", "get"]  # an abort waits, as Ray's callback does
