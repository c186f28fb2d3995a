"""Where an agent should send its requests: the clawray Proxy's address, key, model and headers.

Pure: built from the clawray config (and the environment, for the proxy key) by `target_from_config`.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from core.config import ClawrayConfig

# What an agent is given as its API key when the Proxy needs none (a loopback Proxy without
# `proxy.api_key_env` set): most agents refuse to start without some key. The Proxy ignores it.
PLACEHOLDER_KEY = "clawray-local"


@dataclass(frozen=True)
class Target:
    origin: str  # http://host:port: the Anthropic SDKs append /v1/messages themselves
    api_key: str  # the proxy key's value, or PLACEHOLDER_KEY
    key_env: str | None  # env var holding the proxy key, when one is set (agents that can read env vars)
    model: str  # the id /v1/models lists for "the active policy" (model.policy_alias)
    context_window: int  # model.max_model_len, for agents that budget their prompts by it
    headers: dict[str, str] = field(default_factory=dict)  # static clawray headers (X-User-Id, ...)

    @property
    def openai_base_url(self) -> str:
        """What OpenAI-style clients take as base URL (they append /chat/completions, /responses)."""
        return f"{self.origin}/v1"

    @property
    def max_output_tokens(self) -> int:
        """The output cap written for agents that ask for one: a quarter of the window leaves the rest to
        the agent's long prompt (Claude Code asks for 32,000 by default, more than a small window holds)."""
        return max(1, self.context_window // 4)


def client_host(host: str) -> str:
    """The address a local client dials for a Proxy bound to `host` (a wildcard bind means loopback)."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass  # a host name
    return host


def clawray_headers(user: str | None, workspace: str | None) -> dict[str, str]:
    """Static headers an agent may send on every request. Never a session id: one fixed session id for
    every conversation would merge them all into one session (the Proxy derives one per conversation)."""
    out = {}
    if user:
        out["X-User-Id"] = user
    if workspace:
        out["X-Workspace-Id"] = workspace
    return out


def target_from_config(cfg: ClawrayConfig, *, user: str | None = None, workspace: str | None = None,
                       model: str | None = None, env: dict[str, str] | None = None) -> Target:
    env = dict(os.environ) if env is None else env
    key_env = cfg.proxy.api_key_env
    key = env.get(key_env) if key_env else None
    return Target(
        origin=f"http://{client_host(cfg.proxy.host)}:{cfg.proxy.port}",
        api_key=key or PLACEHOLDER_KEY,
        key_env=key_env if key else None,
        model=model or cfg.model.policy_alias,
        context_window=cfg.model.max_model_len,
        headers=clawray_headers(user, workspace),
    )
