"""cluster/cluster.yaml passes Ray's own cluster-config preparation and schema check (no cloud calls), and
its state setup holds: PostgreSQL + a bucket through env overrides that make a valid config, no shared
file system, no secret in the YAML, the password delivered by the initialization command."""

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


def _container_env(prepared: dict) -> dict[str, str]:
    """The `-e NAME=value` settings every node's container gets."""
    opts = [o[3:] for o in prepared["docker"]["run_options"] if o.startswith("-e ") and "=" in o]
    return dict(o.split("=", 1) for o in opts)


def test_every_node_keeps_state_in_postgresql_and_blobs_in_a_bucket(prepared):
    from core.config import load_config

    cfg = load_config(REPO / "configs" / "local.yaml", env=_container_env(prepared))  # what each process reads
    assert cfg.state.dsn.startswith("postgresql://") and cfg.state.password_env == "CLAWRAY_PG_PASSWORD"
    assert cfg.blob_root().startswith("s3://")  # adapters and checkpoints; the config requires state.dsn
    assert str(cfg.cache_path()) == "/mnt/clawray-local"
    assert "-v /mnt/clawray-local:/mnt/clawray-local" in prepared["docker"]["run_options"]


def test_no_shared_file_system_and_no_secret_in_the_yaml(prepared):
    text = CLUSTER_YAML.read_text()
    assert not any("nfs" in c or "gcsfuse" in c for c in prepared["initialization_commands"])
    assert "CLAWRAY__STORAGE_ROOT=/mnt" not in text
    env = _container_env(prepared)
    assert not [k for k in env if any(w in k for w in ("PASSWORD", "SECRET", "KEY_ID", "API_KEY")) and
                not k.endswith("__PASSWORD_ENV")]
    # The secrets come from the env file the initialization command writes (next test).
    ssh_user = prepared["auth"]["ssh_user"]
    assert f"--env-file /home/{ssh_user}/.clawray/secrets.env" in prepared["docker"]["run_options"]
    assert any("clawray state check" in c for c in prepared["setup_commands"])


def _secret_command(prepared: dict) -> str:
    (cmd,) = [c for c in prepared["initialization_commands"] if "secretsmanager" in c]
    return cmd


@pytest.mark.parametrize("works", [True, False])
def test_the_password_reaches_an_env_file_only_the_ssh_user_reads(prepared, tmp_path, works):
    """The initialization command, run against a stand-in `aws` CLI: the file docker hands to the
    container holds the password (mode 600), and a failed secret read fails the node (no empty file)."""
    import os
    import subprocess

    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    aws = bin_dir / "aws"
    body = 'case "$*" in *"--secret-id clawray/pg-password"*) echo "s3cr3t pw";; *) exit 3;; esac'
    aws.write_text("#!/bin/sh\n" + (body if works else "echo denied >&2; exit 255") + "\n")
    aws.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", "-c", _secret_command(prepared)], env=env, capture_output=True, text=True)
    secrets = home / ".clawray" / "secrets.env"
    if not works:
        assert res.returncode != 0 and not secrets.exists()
        return
    assert res.returncode == 0, res.stderr
    assert secrets.read_text() == "CLAWRAY_PG_PASSWORD=s3cr3t pw\n"
    assert secrets.stat().st_mode & 0o777 == 0o600 and secrets.parent.stat().st_mode & 0o777 == 0o700


def test_ray_validation_would_catch_a_broken_node_type():
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    broken = copy.deepcopy(yaml.safe_load(CLUSTER_YAML.read_text()))
    broken["available_node_types"]["train_gpu"]["resources"]["GPU"] = "four"
    with pytest.raises(ValidationError):
        validate_config(prepare_config(broken))


# ---- cluster/cluster-local.yaml: the same node types on one machine (Ray's fake multi-node provider) ----

LOCAL_YAML = REPO / "cluster" / "cluster-local.yaml"


@pytest.fixture(scope="module")
def local() -> dict:
    # The autoscaler reads this file as it is and validates it (no defaults merged: `ray up` would merge
    # the fake provider's defaults file, which the wheel lacks), so validate exactly that.
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load(LOCAL_YAML.read_text())
    validate_config(config)
    return config


def local_name(real: str, prepared: dict, local: dict) -> str:
    """The local node type standing for `real`: Ray's fixed fake head type for the head, else the same
    name with `_gpu` -> `_cpu` (CPU-only machine)."""
    return local["head_node_type"] if real == prepared["head_node_type"] else real.replace("_gpu", "_cpu")


def custom(resources: dict) -> dict:
    return {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")}


def test_local_cluster_is_the_fake_multinode_provider_with_nothing_to_ssh(local):
    provider = local["provider"]
    assert provider["type"] == "fake_multinode"
    assert provider["disable_node_updaters"] and provider["disable_launch_config_check"]
    assert local["head_node_type"] == "ray.head.default"  # the name the fake provider gives its head
    assert not any(local[k] for k in ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
                                      "initialization_commands", "file_mounts"))


def test_local_cluster_has_the_node_types_of_cluster_yaml(prepared, local):
    """No drift: every node type of cluster.yaml has its local stand-in (and no other exists), with the
    same custom resources (which is what places the engine and the training workers) and the same
    min/max worker counts; nothing local asks for a GPU."""
    real, ours = prepared["available_node_types"], local["available_node_types"]
    assert sorted(local_name(n, prepared, local) for n in real) == sorted(ours)
    for name, rt in real.items():
        lt = ours[local_name(name, prepared, local)]
        assert set(custom(lt["resources"])) == set(custom(rt["resources"])), name
        assert lt.get("min_workers", 0) == rt.get("min_workers", 0), name
        if name != prepared["head_node_type"]:
            assert lt["max_workers"] == rt["max_workers"], name
        assert "GPU" not in lt["resources"], name
    assert local["max_workers"] == prepared["max_workers"]
    assert ours[local["head_node_type"]]["max_workers"] == 0


def _offering(node_types: dict, bundle: dict) -> list[str]:
    return sorted(n for n, t in node_types.items() if all(t["resources"].get(k, 0) >= v for k, v in bundle.items()))


def test_gpu_profile_placement_fits_exactly_the_serving_and_training_node_types(prepared):
    """configs/gpu.yaml's engine replica fits only `serve_gpu`, its training worker only `train_gpu`."""
    from core.config import load_config

    cfg = load_config(REPO / "configs" / "gpu.yaml", env={})
    engine = {"CPU": cfg.engine.num_cpus, "GPU": cfg.engine.num_gpus, **cfg.engine.resources}
    types = prepared["available_node_types"]
    assert _offering(types, engine) == ["serve_gpu"]
    assert _offering(types, cfg.train.worker_bundle()) == ["train_gpu"]


def test_local_cluster_places_the_same_profile_on_its_stand_ins(local):
    """configs/local.yaml with the placement the integration test uses (gpu.yaml's custom resources)."""
    from core.config import load_config

    cfg = load_config(REPO / "configs" / "local.yaml",
                      env={"CLAWRAY__ENGINE__RESOURCES": "{clawray_serve: 1}",
                           "CLAWRAY__TRAIN__WORKER_RESOURCES": "{clawray_train: 1}"})
    engine = {"CPU": cfg.engine.num_cpus + cfg.proxy.num_cpus, **cfg.engine.resources}  # co-located
    types = local["available_node_types"]
    assert _offering(types, engine) == ["serve_cpu"]
    assert _offering(types, cfg.train.worker_bundle()) == ["train_cpu"]


def test_local_cluster_head_flags_and_gcs_address_come_from_the_file(local):
    from cluster.local_cluster import autoscaling_config, head_start_args

    assert head_start_args(local) == ["--num-cpus=4", "--num-gpus=0"]
    auto = autoscaling_config(local, "10.0.0.5:6400", idle_timeout_minutes=0.2)
    assert auto["provider"]["gcs_address"] == "10.0.0.5:6400" and auto["idle_timeout_minutes"] == 0.2
    assert "gcs_address" not in local["provider"] and local["idle_timeout_minutes"] == 1  # not mutated
