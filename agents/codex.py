"""Codex (npm `@openai/codex`): the OpenAI Responses API.

Config: `~/.codex/config.toml` (`$CODEX_HOME/config.toml` when set), TOML, edited line by line so the
user's comments and layout stay. Setup sets `model`, `model_provider = "clawray"`, `model_context_window`
and a `[model_providers.clawray]` table (`base_url` ending in `/v1`, `wire_api = "responses"` — the only
wire API Codex accepts — `http_headers` for the clawray headers, and `env_key` when the Proxy needs a
key). The key itself goes to `~/.codex/.env`, which Codex loads at start, so it never sits in config.toml.
`sandbox_mode`, `approval_policy` and every other key are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.base import Agent, ConfigFile, env_dir, env_with_key, merged, without_none
from agents.target import Target

PROVIDER = "clawray"


def edit_config(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    provider = without_none({
        "name": "clawray",
        "base_url": t.openai_base_url,
        "wire_api": "responses",
        "env_key": t.key_env,
        "http_headers": dict(t.headers) or None,
    })
    out = merged(doc, ("model_providers",), {PROVIDER: provider})
    out.update(model=t.model, model_provider=PROVIDER, model_context_window=t.context_window)
    return out


def files(home: Path, env: Mapping[str, str], t: Target) -> list[ConfigFile]:
    folder = env_dir(env, "CODEX_HOME", home / ".codex")
    out = [ConfigFile(folder / "config.toml", "toml", edit_config)]
    if t.key_env:
        out.append(ConfigFile(folder / ".env", "env", env_with_key, secret=True))
    return out


AGENT = Agent(name="codex", title="Codex", binary="codex", api="OpenAI Responses", headers=True,
              files=files)
