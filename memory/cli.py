"""`clawray memory ...`: inspect, search, export and forget long-term memory of a storage root.

A typer sub-app; the composition-root CLI (cluster/cli.py) mounts it and hands in the embedder factory
for `search` (`set_embedder_factory`; without one, search is full text only). It works on the store the
config's `state` selects (the storage root's SQLite file, or PostgreSQL with `state.dsn`) directly (no
cluster needed; the store's transactions make it safe next to a running `Memory` actor and Proxies,
which see a forget at their next request).

    clawray memory [--config FILE] list [--user U [--workspace W [--session S]]] [--kind K] [--all] [-n N]
                                   search QUERY --user U --workspace W [--session S] [--scope CAP]
                                   show UNIT_ID | export [filters] [--out FILE] | stats
                                   forget (--user U [--workspace W [--session S]] | --unit ID) [--yes]

Errors print one line (`error: ...`) and exit with status 1; no tracebacks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from core.cli_common import fail as _fail
from core.cli_common import keep_config
from core.config import ConfigError, MemoryConfig, load_config
from core.db import DatabaseError
from core.storage import StorageLayout
from memory import admin
from memory.open import open_memory_store
from memory.report import render_markdown, summarize
from memory.retrieval import Embedder, MemorySearch
from memory.store import MemoryStore

memory_app = typer.Typer(name="memory", help="Inspect, search, export and forget long-term memory.",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
_embedder_factory: Callable[..., Embedder] | None = None  # set by the mounting CLI: (model, encoder=) -> embedder

User = Annotated[str | None, typer.Option("--user", "-u", help="user id (X-User-Id)")]
Workspace = Annotated[str | None, typer.Option("--workspace", "-w", help="workspace id (X-Workspace-Id)")]
Session = Annotated[str | None, typer.Option("--session", "-s", help="session id")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]


def set_embedder_factory(factory: Callable[..., Embedder] | None) -> None:
    global _embedder_factory
    _embedder_factory = factory


memory_app.callback()(keep_config)


def _open(ctx: typer.Context) -> tuple[MemoryStore, MemoryConfig, Path]:
    try:
        cfg = load_config(ctx.obj)
    except ConfigError as e:
        raise _fail(str(e)) from None
    root = cfg.storage_path()
    try:
        return open_memory_store(StorageLayout(root).memory, cfg.state, storage_root=root), cfg.memory, root
    except (OSError, ConfigError, DatabaseError) as e:
        raise _fail(f"cannot open the memory store of {root}: {e}") from None


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except admin.AdminError as e:
        raise _fail(str(e)) from None


def _short(text: str, n: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _table(rows: list[dict[str, Any]], title: str, score: bool = False) -> None:
    table = Table(title=title)
    for col in ("unit", "kind", "scope", "user/workspace/session", "updated", "conf", *(["score"] if score else []),
                "content"):
        table.add_column(col, overflow="fold")
    for r in rows:
        owner = "/".join(x for x in (r["user"], r["workspace"], r["session"]) if x)
        status = "" if r["superseded_by"] is None else " (superseded)"
        table.add_row(r["unit_id"][:12], r["kind"], r["level"] + status, _short(owner, 40),
                      f"{r['updated_at']:.0f}", f"{r['confidence']:.2f}", *([f"{r['score']:.4f}"] if score else []),
                      _short(r["content"], 100))
    out.print(table)


@memory_app.command("list")
def list_cmd(ctx: typer.Context, user: User = None, workspace: Workspace = None, session: Session = None,
             kind: Annotated[str | None, typer.Option(help="episodic, semantic, preference, ...")] = None,
             level: Annotated[str | None, typer.Option(help="user, workspace or session")] = None,
             all_: Annotated[bool, typer.Option("--all", help="superseded units too")] = False,
             n: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50, as_json: AsJson = False) -> None:
    """List units, most recently confirmed first."""
    store, _, _ = _open(ctx)
    flt = _run(lambda: admin.unit_filter(user, workspace, session, level, kind, all_))
    rows = admin.list_units(store, flt, n)
    if as_json:
        out.print_json(json.dumps(rows))
    else:
        _table(rows, f"{len(rows)} unit(s)")


@memory_app.command("search")
def search_cmd(ctx: typer.Context, query: Annotated[str, typer.Argument(help="the request's last message")],
               user: User = None, workspace: Workspace = None, session: Session = None,
               scope: Annotated[str, typer.Option(help="X-Memory-Scope: user, workspace, session")] = "user",
               as_json: AsJson = False) -> None:
    """What a request of this user/workspace/session would be given (hybrid retrieval, fused)."""
    store, cfg, _ = _open(ctx)
    if not user or not workspace:
        raise _fail("search needs --user and --workspace (the request's scope)")
    embedder = (_embedder_factory(cfg.embedding_model, encoder=cfg.embedding_encoder)
                if _embedder_factory and cfg.embedding_model else None)
    searcher = MemorySearch(store, cfg, embedder)
    try:
        rows = _run(lambda: admin.search(searcher, query, user, workspace, session or "-", scope))
    finally:
        searcher.close()
    if as_json:
        out.print_json(json.dumps(rows))
    else:
        _table(rows, f"{len(rows)} hit(s){'' if embedder else ' (full text only)'}", score=True)


@memory_app.command("show")
def show_cmd(ctx: typer.Context, unit_id: Annotated[str, typer.Argument(help="unit id")]) -> None:
    """One unit as JSON, with its supersession history."""
    store, _, _ = _open(ctx)
    out.print_json(json.dumps(_run(lambda: admin.show(store, unit_id))))


@memory_app.command("export")
def export_cmd(ctx: typer.Context, user: User = None, workspace: Workspace = None, session: Session = None,
               dest: Annotated[Path | None, typer.Option("--out", "-o", help="file (default: stdout)")] = None
               ) -> None:
    """Every unit (history included) as JSON lines: a user's data, for them or for a move."""
    store, _, _ = _open(ctx)
    flt = _run(lambda: admin.unit_filter(user, workspace, session, include_superseded=True))
    sink = dest.open("w", encoding="utf-8") if dest else sys.stdout
    try:
        n = 0
        for row in admin.export(store, flt):
            sink.write(json.dumps(row) + "\n")
            n += 1
    finally:
        if dest:
            sink.close()
    if dest:
        out.print(f"{n} unit(s) written to {dest}", highlight=False)


@memory_app.command("forget")
def forget_cmd(ctx: typer.Context, user: User = None, workspace: Workspace = None, session: Session = None,
               unit: Annotated[str | None, typer.Option("--unit", help="one unit id")] = None,
               yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False) -> None:
    """Delete for good: one unit, or all memory of a user / workspace / session (and its pending turns)."""
    store, _, _ = _open(ctx)
    what = f"unit {unit}" if unit else "/".join(x for x in (user, workspace, session) if x) or "?"
    if not yes and not typer.confirm(f"forget {what} for good?"):
        raise typer.Exit(1)
    result = _run(lambda: admin.forget(store, user, workspace, session, unit))
    out.print(f"forgot {what}: {result['deleted']} unit(s) deleted", highlight=False)


@memory_app.command("stats")
def stats_cmd(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Units by kind and scope, and what was remembered per user."""
    store, _, _ = _open(ctx)
    data = summarize(store)
    if as_json:
        out.print_json(json.dumps(data))
    else:
        out.print(render_markdown(data), markup=False, highlight=False)
