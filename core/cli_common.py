"""What every `clawray` sub-command group shares: the `--config` option and how a refusal is printed.

The groups (`clawray skills`, `memory`, `agents`, `state`) live in their planes' folders; these few lines
are the same for all of them, so they are written once here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="config YAML (default: $CLAWRAY_CONFIG or configs/local.yaml)")]
err = Console(stderr=True)


def fail(msg: str) -> typer.Exit:
    """Print `msg` as an error (markup escaped: it may quote user input) and return the exit to raise."""
    err.print(f"[red]error:[/red] {escape(msg)}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def keep_config(ctx: typer.Context, config: ConfigOpt = None) -> None:
    """A group's callback: the `--config` path, for its commands to load (`ctx.obj`)."""
    ctx.obj = config
