"""Claude Code (npm `@anthropic-ai/claude-code`): the Anthropic Messages API.

Config: `~/.claude/settings.json` (`$CLAUDE_CONFIG_DIR/settings.json` when set), JSON. Setup sets the
`env` block Claude Code applies to itself (ANTHROPIC_BASE_URL without `/v1`: the SDK appends
`/v1/messages`; ANTHROPIC_AUTH_TOKEN, sent as a bearer token; ANTHROPIC_MODEL and the model every alias
and background request maps to; CLAUDE_CODE_MAX_OUTPUT_TOKENS, a quarter of the served context window,
where Claude Code would ask for 32,000; ANTHROPIC_CUSTOM_HEADERS, one `Name: value` per line) and the
`model` setting. An ANTHROPIC_API_KEY in that block is removed: it would send the user's Anthropic key to
clawray. `permissions`, `sandbox` and every other setting are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.base import Agent, ConfigFile, env_dir, merged
from agents.target import Target

# Claude Code sends background work (titles, summaries) to its "small/fast" model and resolves the
# sonnet/opus/haiku aliases through these: all of them must name a model clawray serves.
MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
              "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")


def edit_settings(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    env = {"ANTHROPIC_BASE_URL": t.origin, "ANTHROPIC_AUTH_TOKEN": t.api_key,
           **{v: t.model for v in MODEL_VARS}, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(t.max_output_tokens)}
    if t.headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in t.headers.items())
    out = merged(doc, ("env",), env)
    out["env"].pop("ANTHROPIC_API_KEY", None)
    out["model"] = t.model
    return out


def files(home: Path, env: Mapping[str, str], t: Target) -> list[ConfigFile]:
    folder = env_dir(env, "CLAUDE_CONFIG_DIR", home / ".claude")
    return [ConfigFile(folder / "settings.json", "json", edit_settings, secret=True)]


AGENT = Agent(name="claude-code", title="Claude Code", binary="claude", api="Anthropic Messages",
              headers=True, files=files)
