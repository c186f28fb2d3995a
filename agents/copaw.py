"""CoPaw (PyPI `copaw`): OpenAI Chat Completions (AgentScope's OpenAIChatModel).

Config: CoPaw keeps its providers in its secret folder (`~/.copaw.secret`, or `$COPAW_SECRET_DIR`, or
`$COPAW_WORKING_DIR.secret`), one JSON file per provider. Setup writes the custom provider
`providers/custom/clawray.json` (`base_url` ending in `/v1`, the model as a user-added model) and makes
it the global active model (`providers/active_model.json`). CoPaw encrypts a plaintext `api_key` in place
the first time it loads the file, so after a run `clawray agents list` shows the file as changed; restore
still puts the original back. CoPaw's provider config has no custom headers; an agent-specific model in a
workspace's `agent.json` still wins over the global one (CoPaw's own rule), and is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.base import Agent, ConfigFile, env_dir
from agents.target import Target

PROVIDER = "clawray"


def edit_provider(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    return {**doc, "id": PROVIDER, "name": "clawray", "base_url": t.openai_base_url,
            "api_key": t.api_key, "chat_model": "OpenAIChatModel",
            "extra_models": [{"id": t.model, "name": t.model}], "is_custom": True,
            "require_api_key": bool(t.key_env)}


def edit_active(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    return {**doc, "provider_id": PROVIDER, "model": t.model}


def secret_dir(home: Path, env: Mapping[str, str]) -> Path:
    working = env_dir(env, "COPAW_WORKING_DIR", home / ".copaw")
    return env_dir(env, "COPAW_SECRET_DIR", Path(f"{working}.secret"))


def files(home: Path, env: Mapping[str, str], t: Target) -> list[ConfigFile]:
    root = secret_dir(home, env) / "providers"
    return [ConfigFile(root / "custom" / f"{PROVIDER}.json", "json", edit_provider, secret=True),
            ConfigFile(root / "active_model.json", "json", edit_active, secret=True)]


AGENT = Agent(name="copaw", title="CoPaw", binary="copaw", api="OpenAI Chat Completions", headers=False,
              files=files)
