"""`clawray skills evolve --now | decisions | promote`: the running system's collective job.

These need the running cluster (the Evolver actor holds the job; its gate replays through the engine), so
they live here in the composition root and are added to evolve/cli.py's `skills` sub-app, whose other
commands work on the library's files without a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from core import names
from core.cli_common import fail
from core.config import ConfigError, load_config

out = Console()


def _evolver(ctx: typer.Context) -> Any:
    from cluster.cli import CLIError, _connect

    config: Path | None = ctx.obj
    try:
        cfg = load_config(config)
    except ConfigError as e:
        raise fail(str(e)) from None
    try:
        _connect(cfg)
    except CLIError as e:
        raise fail(f"{e} ({e.hint})" if e.hint else str(e)) from None
    try:
        return names.actor(names.EVOLVER, cfg.ray.namespace, timeout_s=0)
    except ValueError:
        raise fail("the Evolver actor is not running; start clawray with `clawray start`") from None


def evolve(ctx: typer.Context,
           now: Annotated[bool, typer.Option("--now", help="run the collective job now, idle or not")] = False,
           as_json: Annotated[bool, typer.Option("--json", help="print the job's report as JSON")] = False) -> None:
    """Run the collective evolve job: every user's new sessions -> refine / create / optimise / skip ->
    the validation gate -> new skill versions."""
    import ray

    if not now:
        raise fail("the job runs on its schedule (evolver.collective.interval_s, while serving is idle); "
                   "pass --now to run it at once")
    evolver = _evolver(ctx)
    try:
        with out.status("collective evolution: deciding and validating…"):
            report = ray.get(evolver.collective_run.remote())
    except ray.exceptions.RayError as e:
        cause = getattr(e, "cause", None) or e
        raise fail(f"the collective job failed: {str(cause).splitlines()[0][:300]}") from None
    if as_json:
        out.print_json(json.dumps(report, default=str))
        return
    t = Table(title=f"collective job {report['job']}: {report['rows']} new turn(s) in {report['sessions']} "
                    f"session(s), {report['groups']} group(s)")
    for col in ("group", "action", "skill", "published", "outcome"):
        t.add_column(col)
    for d in report["decisions"]:
        t.add_row(escape(d["group"]), d["action"], escape(d["skill"] or "-"), "yes" if d["published"] else "no",
                  escape(d["outcome"][:120]))
    out.print(t)
    out.print(f"generation {report['generation']}" + (f"; {report['skipped_reason']}" if report["skipped_reason"] else ""))


def decisions(ctx: typer.Context, n: Annotated[int, typer.Option("--limit", "-n", min=1)] = 20,
              as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The collective job's recent decisions, rejections included, with their edit summaries and verdicts."""
    import ray

    rows = ray.get(_evolver(ctx).collective_decisions.remote(n))
    if as_json:
        out.print_json(json.dumps(rows, default=str))
        return
    t = Table(title="collective decisions (newest first)")
    for col in ("job", "skill", "action", "published", "outcome", "summary"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["job"], escape(r["skill"] or "-"), r["action"], "yes" if r["published"] else "no",
                  escape(str(r.get("outcome", ""))[:80]), escape(str(r.get("summary", ""))[:160]))
    out.print(t)


def promote(ctx: typer.Context, name: Annotated[str, typer.Argument(help="skill name")],
            to: Annotated[str, typer.Option("--to", help="global | group:<name> | user:<id> | "
                                                        "workspace:<user>/<workspace>")]) -> None:
    """Serve a skill to a wider scope, through the validation gate (its owner's tasks must show it helps;
    tasks of its new audience must not get worse)."""
    import ray

    from evolve.scopes import check_scope

    try:
        check_scope(to)
    except ValueError as e:
        raise fail(str(e)) from None
    evolver = _evolver(ctx)
    try:
        with out.status(f"promoting {name} to {to}: replaying through the gate…"):
            report = ray.get(evolver.collective_promote.remote(name, to))
    except ray.exceptions.RayError as e:
        cause = getattr(e, "cause", None) or e
        raise fail(str(cause).splitlines()[0][:300]) from None
    (d,) = report["decisions"]
    if not d["published"]:
        raise fail(f"{name} was not promoted: {d['outcome']}")
    out.print(f"{escape(name)} is now served to {escape(to)} (generation {report['generation']})")


def mount(skills_app: typer.Typer) -> None:
    skills_app.command("evolve")(evolve)
    skills_app.command("decisions")(decisions)
    skills_app.command("promote")(promote)
