"""Hermes Agent (PyPI `hermes-agent`): OpenAI Chat Completions.

Config: `~/.hermes/config.yaml` (`$HERMES_HOME/config.yaml` when set), YAML, re-serialised (comments
do not survive; the backup keeps them). Setup adds the named provider `providers.clawray` (`base_url`
ending in `/v1`, `api_mode: chat_completions`, `extra_headers` for the clawray headers, `context_length`
so Hermes budgets its own compression by what clawray serves) and selects it:
`model.provider: custom:clawray`, `model.default: <model>`. A key goes to `~/.hermes/.env` (Hermes's
place for secrets; `key_env` names it); without one the provider gets a placeholder `api_key`. The
`terminal`, approval and every other section are kept.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.base import Agent, ConfigFile, env_dir, env_with_key, merged, without_none
from agents.target import Target

PROVIDER = "clawray"


def edit_config(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    provider = without_none({
        "name": PROVIDER, "base_url": t.openai_base_url, "api_mode": "chat_completions",
        "key_env": t.key_env, "api_key": None if t.key_env else t.api_key, "default_model": t.model,
        "extra_headers": dict(t.headers) or None, "context_length": t.context_window})
    out = merged(doc, ("providers",), {PROVIDER: provider})
    # `model` may be a bare string (older configs): it becomes the mapping newer Hermes writes.
    model = copy.deepcopy(out["model"]) if isinstance(out.get("model"), dict) else {}
    # A `base_url` / `api_key` left on the model block would route around the provider selected here.
    for k in ("base_url", "api_key"):
        model.pop(k, None)
    model.update(default=t.model, provider=f"custom:{PROVIDER}")
    out["model"] = model
    return out


def files(home: Path, env: Mapping[str, str], t: Target) -> list[ConfigFile]:
    folder = env_dir(env, "HERMES_HOME", home / ".hermes")
    out = [ConfigFile(folder / "config.yaml", "yaml", edit_config)]
    if t.key_env:
        out.append(ConfigFile(folder / ".env", "env", env_with_key, secret=True))
    return out


AGENT = Agent(name="hermes", title="Hermes Agent", binary="hermes", api="OpenAI Chat Completions",
              headers=True, files=files)
