from pathlib import Path

import pytest

from core.config import REPO_ROOT, ConfigError, config_from_dict, load_config


def test_local_yaml_loads_with_defaults():
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env={})
    assert cfg.model.path == "tiny" and cfg.engine.device == "cpu"
    assert cfg.storage_path() == REPO_ROOT / "state" / "local"


def test_gpu_yaml_loads():
    cfg = load_config(REPO_ROOT / "configs" / "gpu.yaml", env={})
    assert cfg.engine.device == "gpu" and cfg.model.path != "tiny"


def test_env_override_nested_and_typed():
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml",
                      env={"CLAWRAY__TRAIN__LR": "1e-4", "CLAWRAY__PROXY__PORT": "9001",
                           "CLAWRAY__TRAIN__NUM_WORKERS": "[1, 2]"})
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.proxy.port == 9001
    assert tuple(cfg.train.num_workers) == (1, 2)


def test_unknown_key_is_named(tmp_path: Path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"train\.lrr: unknown key"):
        load_config(p, env={})


def test_invalid_value_is_named():
    with pytest.raises(ConfigError, match=r"proxy\.port"):
        config_from_dict({"proxy": {"port": 70000}})
    with pytest.raises(ConfigError, match=r"scheduler\.sleep_start"):
        config_from_dict({"scheduler": {"sleep_start": "25:00"}})


def test_unknown_env_override_is_named():
    with pytest.raises(ConfigError, match=r"proxy\.colour: unknown key"):
        load_config(REPO_ROOT / "configs" / "local.yaml", env={"CLAWRAY__PROXY__COLOUR": "red"})


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, env={})


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="engine.upstream"):
        config_from_dict({"engine": {"backend": "upstream"}})
    with pytest.raises(ConfigError, match="num_workers"):
        config_from_dict({"train": {"num_workers": [3, 1]}})
