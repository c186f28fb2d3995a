"""`engine.default_temperature` becomes vLLM's own server-wide default (issue 12 item 10).

Requests that send no temperature are sampled at it; a request's own temperature wins (vLLM's
`to_sampling_params` priority: request, then server default, then 1.0). The integration learning test
checks the served side: its requests send none and every sample records the default.
"""

from __future__ import annotations

import pytest

from core.config import ConfigError, EngineConfig, ModelConfig, config_from_dict


def _parsed(engine: EngineConfig):
    """`vllm serve`'s own parser over our flags: what the engine is built from."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from serve.vllm_engine import vllm_cli_args

    return make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_cli_args("/m", ModelConfig(), engine))


def test_default_temperature_is_the_engines_generation_config_override():
    assert _parsed(EngineConfig(default_temperature=0.1)).override_generation_config == {"temperature": 0.1}


def test_no_default_temperature_leaves_the_models_generation_config_alone():
    assert _parsed(EngineConfig()).override_generation_config == {}


def test_a_request_without_temperature_gets_the_server_default_and_its_own_wins():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    defaults = {"temperature": 0.1}  # what vLLM's ModelConfig.get_diff_sampling_param() yields from the override
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest(**body).to_sampling_params(8, defaults).temperature == 0.1
    assert ChatCompletionRequest(**body, temperature=1.0).to_sampling_params(8, defaults).temperature == 1.0


def test_default_temperature_out_of_range_is_refused_with_its_key():
    with pytest.raises(ConfigError, match="engine.default_temperature"):
        config_from_dict({"engine": {"default_temperature": 3}})


def test_setup_for_a_real_model_drops_the_tiny_models_default_temperature(tmp_path):
    """`clawray setup` starts from configs/local.yaml, whose 0.1 exists for the random-weight tiny model
    only; a real model keeps its own generation config (and clients' temperatures) instead."""
    from typer.testing import CliRunner

    from cluster.cli import app
    from core.config import load_config

    def written(model: str):
        out = tmp_path / f"{model.replace('/', '_')}.yaml"
        result = CliRunner().invoke(app, ["setup", "--out", str(out), "--model", model])
        assert result.exit_code == 0, result.output
        return load_config(out, env={}).engine.default_temperature

    assert written("tiny") == load_config(env={}).engine.default_temperature == 0.1
    assert written("Qwen/Qwen3-4B-Instruct-2507") is None
