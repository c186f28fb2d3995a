"""cluster/cluster.yaml passes Ray's own cluster-config preparation and schema check (no cloud calls)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "cluster" / "cluster.yaml"


@pytest.fixture(scope="module")
def prepared() -> dict:
    # What `ray up` does before it talks to the cloud: merge the provider's defaults, then validate.
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load(CLUSTER_YAML.read_text()))
    validate_config(config)
    return config


def test_cluster_yaml_passes_ray_validation(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] == "head"


def test_head_is_cpu_only_and_gpu_node_types_exist(prepared):
    types = prepared["available_node_types"]
    assert "GPU" not in types["head"]["resources"]
    assert types["serve_gpu"]["resources"]["GPU"] >= 1 and types["serve_gpu"]["min_workers"] >= 1
    assert types["serve_gpu"]["resources"]["clawray_serve"] >= 1


def test_training_nodes_start_at_zero_and_are_reachable_by_resource_request(prepared):
    train = prepared["available_node_types"]["train_gpu"]
    assert train["min_workers"] == 0 and train["max_workers"] >= 1
    assert train["resources"]["GPU"] >= 1
    # The Controller requests {GPU: 1, clawray_train: 1} bundles; only this node type offers them.
    offering = [n for n, t in prepared["available_node_types"].items() if "clawray_train" in t["resources"]]
    assert offering == ["train_gpu"]


def test_setup_installs_project_with_gpu_extra_from_mounted_folder(prepared):
    assert "~/clawray" in prepared["file_mounts"]
    assert any("pip install" in c and "-e '.[gpu]'" in c for c in prepared["setup_commands"])
    assert any("ray start --head" in c for c in prepared["head_start_ray_commands"])
    assert any("ray start --address=$RAY_HEAD_IP" in c for c in prepared["worker_start_ray_commands"])


def test_storage_root_env_points_at_the_mounted_shared_folder(prepared):
    options = prepared["docker"]["run_options"]
    assert "-e CLAWRAY__STORAGE_ROOT=/mnt/clawray" in options
    assert "-v /mnt/clawray:/mnt/clawray" in options
    assert any("/mnt/clawray" in c and "mount" in c for c in prepared["initialization_commands"])


def test_ray_validation_would_catch_a_broken_node_type():
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    broken = copy.deepcopy(yaml.safe_load(CLUSTER_YAML.read_text()))
    broken["available_node_types"]["train_gpu"]["resources"]["GPU"] = "four"
    with pytest.raises(ValidationError):
        validate_config(prepare_config(broken))
