"""What clawray knows about one agent: its config files, their format, and the pure edit that points
the agent at clawray. Each agent module (agents/claude_code.py, ...) defines one `Agent`.

An edit takes the parsed document (a dict, never mutated) and the `Target` and returns the new document.
Edits set only the keys that route the agent's model traffic (endpoint, key, model, headers); they never
touch the agent's sandbox, permission or approval settings.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.target import Target
from core.config import REPO_ROOT

# Where scripts/install_agents.sh puts its wrappers (one per agent CLI, Node 24 first on PATH).
CACHE_BIN = REPO_ROOT / ".cache" / "agents" / "bin"

Edit = Callable[[dict[str, Any], Target], dict[str, Any]]


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    fmt: str  # agents/formats.py FORMATS
    edit: Edit
    secret: bool = False  # may hold a key: a new file is created readable by its owner only


@dataclass(frozen=True)
class Agent:
    name: str  # the CLI's NAME: `clawray agents setup NAME`
    title: str
    binary: str  # the agent's command
    api: str  # the API it speaks to clawray
    headers: bool  # whether its config can add the clawray headers
    # The files to write, for a home folder and environment (agents honour env overrides such as
    # CODEX_HOME); a function of the target too, since some files are written only when a key is set.
    files: Callable[[Path, Mapping[str, str], Target], list[ConfigFile]]

    def config_paths(self, home: Path, env: Mapping[str, str], target: Target) -> list[Path]:
        return [f.path for f in self.files(home, env, target)]


def installed(agent: Agent, env: Mapping[str, str] | None = None) -> str | None:
    """The agent's command on PATH, else the one `make agents` cached; None when neither exists."""
    env = os.environ if env is None else env
    found = shutil.which(agent.binary, path=env.get("PATH"))
    if found:
        return found
    cached = CACHE_BIN / agent.binary
    return str(cached) if cached.is_file() and os.access(cached, os.X_OK) else None


def env_dir(env: Mapping[str, str], var: str, default: Path) -> Path:
    """An agent's config folder: its env override when set (expanded like the agent does), else default."""
    value = env.get(var)
    return Path(value).expanduser() if value else default


# ---- helpers the edits share (pure) ---------------------------------------------------------------

def merged(doc: dict[str, Any], path: tuple[str, ...], values: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `doc` with `values` set in the mapping at `path` (created when missing; a non-mapping
    in the way is replaced, since the agent could not have read our keys under it)."""
    out = copy.deepcopy(doc)
    node = out
    for key in path:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node.update(copy.deepcopy(dict(values)))
    return out


def without_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def env_with_key(doc: dict[str, Any], t: Target) -> dict[str, Any]:
    """A .env document with the proxy key under its variable (the agent's own place for secrets)."""
    out = dict(doc)
    if t.key_env:
        out[t.key_env] = t.api_key
    return out
