"""Placement (issue 14 item 3): what the engine replicas and the training workers ask Ray for, and what the
Controller asks the autoscaler for. No cluster needed: the bound deployments and the TorchTrainer are
built, not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import REPO_ROOT, ConfigError, config_from_dict, load_config
from core.storage import StorageLayout

TRAIN_NODE = {"train": {"worker_resources": {"clawray_train": 1}}}


def _actor_options(app) -> dict:
    return app._bound_deployment.ray_actor_options


def _scaling_resources(cfg, tmp_path: Path) -> dict[str, float]:
    from train.job import build_trainer

    trainer = build_trainer(cfg.train, model_path="m", storage=StorageLayout(tmp_path), max_steps=1, run_name="r")
    return trainer.scaling_config._resources_per_worker_not_none  # what Ray Train asks per worker


@pytest.mark.parametrize("train", [
    {"worker_resources": {"clawray_train": 1}},
    {"worker_resources": {"clawray_train": 1}, "num_workers": [1, 3], "cpus_per_worker": 0.5},
    {"worker_resources": {"clawray_train": 1}, "use_gpu": True, "num_workers": 2},
    {},
])
def test_training_workers_ask_for_exactly_the_bundles_the_controller_requests(tmp_path, train):
    """A node the autoscaler adds for the Controller's request must fit a worker: same resources, one
    bundle per (max) worker."""
    from cluster.controller import training_bundles

    cfg = config_from_dict({"train": train})
    bundles = training_bundles(cfg)
    assert len(bundles) == cfg.train.max_workers()
    assert all(b == _scaling_resources(cfg, tmp_path) for b in bundles)
    assert bundles[0].get("clawray_train") == train.get("worker_resources", {}).get("clawray_train")
    assert bundles[0].get("GPU") == (1.0 if train.get("use_gpu") else None)


@pytest.mark.parametrize("colocate", [False, True])
@pytest.mark.parametrize("backend", ["vllm", "upstream"])
def test_engine_replicas_ask_for_the_engine_resources(colocate, backend):
    from cluster.serve_app import build_colocated, build_engine

    upstream = {"upstream": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}} if backend == "upstream" else {}
    cfg = config_from_dict({"engine": {"backend": backend, "resources": {"clawray_serve": 1}, **upstream},
                            "proxy": {"colocate": colocate}})
    app = build_colocated(cfg) if colocate else build_engine(cfg)
    assert _actor_options(app)["resources"] == {"clawray_serve": 1.0}


def test_no_custom_resources_by_default_so_one_machine_schedules_everything(tmp_path):
    from cluster.controller import training_bundles
    from cluster.serve_app import build_colocated, build_engine

    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env={})
    assert cfg.engine.resources == {} and cfg.train.worker_resources == {}
    assert "resources" not in _actor_options(build_engine(cfg))
    assert "resources" not in _actor_options(build_colocated(cfg))
    assert training_bundles(cfg) == [{"CPU": cfg.train.cpus_per_worker}]
    assert _scaling_resources(cfg, tmp_path) == {"CPU": cfg.train.cpus_per_worker}


def test_gpu_profile_places_engine_on_serving_and_workers_on_training_nodes(tmp_path):
    """docs/cluster.md: the engine asks for {GPU, clawray_serve}, each training worker for {GPU, clawray_train}."""
    from cluster.controller import training_bundles
    from cluster.serve_app import build_engine

    cfg = load_config(REPO_ROOT / "configs" / "gpu.yaml", env={})
    opts = _actor_options(build_engine(cfg))
    assert opts["num_gpus"] == 1 and opts["resources"] == {"clawray_serve": 1.0}
    (bundle,) = training_bundles(cfg)
    assert bundle["GPU"] == 1 and bundle["clawray_train"] == 1
    assert _scaling_resources(cfg, tmp_path) == bundle


@pytest.mark.parametrize("section,key", [("engine", "resources"), ("train", "worker_resources")])
@pytest.mark.parametrize("bad", [{"GPU": 1}, {"CPU": 2}, {"clawray_x": 0}])
def test_cpu_gpu_and_empty_amounts_are_refused_in_custom_resources(section, key, bad):
    with pytest.raises(ConfigError, match=rf"{section}\.{key}"):
        config_from_dict({section: {key: bad}})


def test_custom_resources_from_env_override():
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml",
                      env={"CLAWRAY__TRAIN__WORKER_RESOURCES": "{clawray_train: 1}",
                           "CLAWRAY__ENGINE__RESOURCES": "{clawray_serve: 1}"})
    assert cfg.train.worker_resources == {"clawray_train": 1.0}
    assert cfg.engine.resources == {"clawray_serve": 1.0}


def test_a_head_clawray_starts_offers_the_custom_resources_the_config_asks_for():
    """One machine (`clawray start` without `ray.address`): no node type offers clawray_serve or
    clawray_train, so the head itself must, or the engine and the workers would wait for ever."""
    from cluster.runtime import local_custom_resources

    assert local_custom_resources(config_from_dict({})) == {}
    cfg = config_from_dict({"engine": {"resources": {"clawray_serve": 1}, "num_replicas": 2},
                            "train": {"worker_resources": {"clawray_train": 1, "x": 0.5}, "num_workers": [1, 3]}})
    assert local_custom_resources(cfg) == {"clawray_serve": 2.0, "clawray_train": 3.0, "x": 1.5}
