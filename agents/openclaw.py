"""OpenClaw (npm `openclaw`, Node >= 24): OpenAI Chat Completions (`api: "openai-completions"`).

Config: `~/.openclaw/openclaw.json` (`$OPENCLAW_CONFIG_PATH`, else `$OPENCLAW_STATE_DIR/openclaw.json`,
else under `$OPENCLAW_HOME`). OpenClaw reads JSON5; setup writes plain JSON (valid JSON5) and refuses a
file with JSON5-only syntax (comments, trailing commas) rather than drop the user's comments. Setup adds
the provider `models.providers.clawray` (`baseUrl` ending in `/v1`, `headers`, one model with the
context window clawray serves) and makes `clawray/<model>` the default model
(`agents.defaults.model.primary`; fallbacks are kept, `models.mode` defaults to `merge` so hosted models
stay available). With a proxy key the provider's `apiKey` is an env SecretRef and the key goes to
`~/.openclaw/.env`, OpenClaw's own place for provider keys. Tool, sandbox and approval settings are kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.base import Agent, ConfigFile, env_dir, env_with_key, merged, without_none
from agents.target import Target

PROVIDER = "clawray"
SECRET_ID = re.compile(r"[A-Z][A-Z0-9_]{0,127}")  # OpenClaw's schema for an env SecretRef id


def _key_ref(t: Target) -> str | dict[str, str]:
    if t.key_env and SECRET_ID.fullmatch(t.key_env):
        return {"source": "env", "provider": "default", "id": t.key_env}
    return t.api_key  # a loopback Proxy without a key: OpenClaw accepts a local marker


def edit_config(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    model = {"id": t.model, "name": f"clawray ({t.model})", "reasoning": False, "input": ["text"],
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
             "contextWindow": t.context_window, "maxTokens": t.max_output_tokens}
    provider = without_none({"baseUrl": t.openai_base_url, "apiKey": _key_ref(t), "api": "openai-completions",
                             "headers": dict(t.headers) or None, "models": [model]})
    out = merged(doc, ("models", "providers"), {PROVIDER: provider})
    out["models"].setdefault("mode", "merge")
    return merged(out, ("agents", "defaults", "model"), {"primary": f"{PROVIDER}/{t.model}"})


def state_dir(home: Path, env: Mapping[str, str]) -> Path:
    base = env_dir(env, "OPENCLAW_HOME", home)
    return env_dir(env, "OPENCLAW_STATE_DIR", base / ".openclaw")


def files(home: Path, env: Mapping[str, str], t: Target) -> list[ConfigFile]:
    state = state_dir(home, env)
    config = Path(env["OPENCLAW_CONFIG_PATH"]).expanduser() if env.get("OPENCLAW_CONFIG_PATH") \
        else state / "openclaw.json"
    out = [ConfigFile(config, "json", edit_config)]
    if t.key_env and SECRET_ID.fullmatch(t.key_env):
        out.append(ConfigFile(state / ".env", "env", env_with_key, secret=True))
    return out


AGENT = Agent(name="openclaw", title="OpenClaw", binary="openclaw", api="OpenAI Chat Completions",
              headers=True, files=files)
