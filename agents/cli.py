"""`clawray agents ...`: point an agent's own config at clawray, and put it back.

A typer sub-app; the composition-root CLI (cluster/) mounts it with `app.add_typer(agents_app,
name="agents")`. It needs no running cluster: it reads the clawray config for the Proxy's address, the
key (the value of `proxy.api_key_env` in this environment) and the model alias, and edits files under
$HOME.

    clawray agents [--config FILE] list | setup NAME [--user U] [--workspace W] [--model M] | restore NAME

Errors print one line (`error: ...`) and exit with status 1; a file in a format the agent does not use
is refused and left untouched.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agents import apply
from agents.base import Agent, installed
from agents.registry import AGENTS, get
from agents.target import Target, target_from_config
from core.cli_common import fail as _fail
from core.cli_common import keep_config
from core.config import ConfigError, load_config

agents_app = typer.Typer(name="agents", no_args_is_help=True, add_completion=False,
                         pretty_exceptions_enable=False,
                         help="Point an agent (OpenClaw, Claude Code, Codex, CoPaw, Hermes, Qwen Code) at clawray.")
out = Console(soft_wrap=True)
NameArg = Annotated[str, typer.Argument(help=f"one of: {', '.join(AGENTS)}")]


agents_app.callback()(keep_config)


def _target(ctx: typer.Context, **kw: str | None) -> Target:
    try:
        return target_from_config(load_config(ctx.obj), **kw)
    except ConfigError as e:
        raise _fail(str(e)) from None


def _agent(name: str) -> Agent:
    try:
        return get(name)
    except KeyError as e:
        raise _fail(e.args[0]) from None


def _state(agent: Agent, target: Target) -> str:
    files = apply.status(agent, Path.home(), os.environ, target)
    if not any(f.backed_up for f in files):
        return "off"
    return "on, changed since setup" if any(f.changed_since_setup for f in files) else "on"


@agents_app.command("list")
def list_cmd(ctx: typer.Context) -> None:
    """Each agent: installed or not, its config files, whether clawray setup is active."""
    target = _target(ctx)
    table = Table("agent", "API", title="agents")
    for col in ("installed", "config", "clawray"):
        table.add_column(col, overflow="fold")
    for a in AGENTS.values():
        paths = "\n".join(str(p) for p in a.config_paths(Path.home(), os.environ, target))
        table.add_row(a.name, a.api, installed(a) or "no", escape(paths), _state(a, target))
    out.print(table)


@agents_app.command("setup")
def setup_cmd(
    ctx: typer.Context, name: NameArg,
    user: Annotated[str | None, typer.Option(help="X-User-Id the agent sends (default: your login name)")] = None,
    workspace: Annotated[str | None, typer.Option(help="X-Workspace-Id the agent sends")] = None,
    model: Annotated[str | None, typer.Option(help="model id (default: the config's model.policy_alias)")] = None,
) -> None:
    """Write the agent's own config to use clawray; the first setup keeps a backup for `restore`."""
    agent = _agent(name)
    target = _target(ctx, user=user if user is not None else getpass.getuser(), workspace=workspace,
                     model=model)
    try:
        done = apply.setup(agent, Path.home(), os.environ, target)
    except (apply.AgentSetupError, OSError) as e:
        raise _fail(str(e)) from None
    for p in done:
        out.print(f"wrote {escape(str(p.file.path))}")
    out.print(f"{agent.title} now uses clawray at {target.openai_base_url} with model {target.model}"
              + ("" if agent.headers or not target.headers else " (it cannot send the clawray headers)"))
    if target.key_env:
        out.print(f"the key ({target.key_env}) went where {agent.title} keeps its secrets; "
                  f"`clawray agents restore {agent.name}` removes it")
    if not installed(agent):
        out.print(f"[yellow]note:[/] `{agent.binary}` is not installed here (`make agents` caches it)")


@agents_app.command("restore")
def restore_cmd(name: NameArg) -> None:
    """Put the agent's config back exactly as it was before the first setup."""
    agent = _agent(name)
    try:
        done = apply.restore(agent, Path.home())
    except (apply.AgentSetupError, OSError) as e:
        raise _fail(str(e)) from None
    for path, what in done:
        out.print(f"{what}: {escape(str(path))}")
