"""Issue 12 item 9: a LoRA rank the engine cannot load is refused when the config loads, not at the first
hot-swap (vLLM refuses an adapter whose rank exceeds `--max-lora-rank` only when it is loaded)."""

from __future__ import annotations

import pytest

from core.config import ConfigError, config_from_dict, load_config
from tests.conftest import REPO


def test_train_lora_rank_above_engine_max_lora_rank_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train\.lora\.rank \(32\).*engine\.max_lora_rank \(16\)"):
        config_from_dict({"train": {"lora": {"rank": 32}}, "engine": {"max_lora_rank": 16}})


def test_env_override_is_checked_too():
    env = {"CLAWRAY__TRAIN__LORA__RANK": "64"}
    with pytest.raises(ConfigError, match="max_lora_rank"):
        load_config(REPO / "configs" / "local.yaml", env=env)


def test_rank_equal_to_the_engine_limit_and_upstream_backends_load():
    cfg = config_from_dict({"train": {"lora": {"rank": 16}}, "engine": {"max_lora_rank": 16}})
    assert cfg.train.lora.rank == cfg.engine.max_lora_rank
    upstream = {"backend": "upstream", "max_lora_rank": 8,
                "upstream": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}
    # An upstream engine loads no clawray adapters: its max_lora_rank does not apply.
    assert config_from_dict({"train": {"lora": {"rank": 32}}, "engine": upstream}).train.lora.rank == 32
