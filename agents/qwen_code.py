"""Qwen Code (npm `@qwen-code/qwen-code`): OpenAI Chat Completions.

Config: `~/.qwen/settings.json` (`$QWEN_HOME/settings.json` when set), JSON. Qwen Code also reads
comments in it; setup refuses such a file (it writes plain JSON and will not drop them). Setup puts a
clawray model first in `modelProviders.openai` (`baseUrl` ending in `/v1`, `envKey`,
`generationConfig.customHeaders` for the clawray headers and `contextWindowSize`, by which Qwen Code
compresses its history), selects it (`security.auth.selectedType: openai`, `model.name`) and puts the key
in the settings' own `env` block, since Qwen Code needs one even when the Proxy does not. Other providers,
`tools`, approval mode and every other setting are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.base import Agent, ConfigFile, env_dir, merged, without_none
from agents.target import Target

KEY_VAR = "CLAWRAY_API_KEY"  # the variable Qwen Code reads the key from when the Proxy names none


def edit_settings(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    key_var = t.key_env or KEY_VAR
    ours = {"id": t.model, "name": "clawray", "baseUrl": t.openai_base_url, "envKey": key_var,
            "generationConfig": without_none({"customHeaders": dict(t.headers) or None,
                                              "contextWindowSize": t.context_window})}
    providers = doc.get("modelProviders") if isinstance(doc.get("modelProviders"), dict) else {}
    others = [m for m in providers.get("openai") or [] if not (isinstance(m, dict) and (
        m.get("id") == t.model or m.get("baseUrl") == t.openai_base_url))]
    out = merged(doc, ("modelProviders",), {"openai": [ours, *others]})
    out = merged(out, ("security", "auth"), {"selectedType": "openai"})
    out = merged(out, ("model",), {"name": t.model})
    return merged(out, ("env",), {key_var: t.api_key})


def files(home: Path, env: Mapping[str, str], t: Target) -> list[ConfigFile]:
    folder = env_dir(env, "QWEN_HOME", home / ".qwen")
    return [ConfigFile(folder / "settings.json", "json", edit_settings, secret=True)]


AGENT = Agent(name="qwen-code", title="Qwen Code", binary="qwen", api="OpenAI Chat Completions",
              headers=True, files=files)
