"""`clawray state ...`: which state database the config selects and what it holds (`check`), and copying
an embedded SQLite state into PostgreSQL (`migrate`; cluster/state_migrate.py says what is copied and
how). Mounted by cluster/cli.py.

    clawray state check [-c FILE] [--json]
    clawray state migrate [-c FILE] [--to postgresql://user@host:5432/db] [--password-env VAR]
                          [--namespace clawray] [--from STORAGE_ROOT]

`migrate` defaults to the config's `state:` section for the target and its storage root for the source,
so after `clawray config set state.dsn ...` a bare `clawray state migrate` copies the state it replaces.
Errors (an unreachable server, a count mismatch) print one line and exit with status 1. No password is
ever printed: DSNs are shown through core.db.redact_dsn, and a rejected option is named, not echoed.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cluster.state_migrate import (
    MigrationError,
    TableResult,
    embedded_stores,
    inventory,
    migrate,
    not_copied,
)
from core.cli_common import ConfigOpt
from core.cli_common import fail as _fail
from core.config import ConfigError, StateConfig, load_config
from core.db import DatabaseError, redact_dsn
from core.state import is_network_fs, mount_fs_type

state_app = typer.Typer(name="state", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        help="The state database: check it; migrate an embedded SQLite state into PostgreSQL.")
out = Console()


def target_config(state: StateConfig, to: str | None, password_env: str | None,
                  namespace: str | None) -> StateConfig:
    """The PostgreSQL to migrate into: the options over the config's `state:` section."""
    fields = state.model_dump() | {k: v for k, v in
                                   {"dsn": to, "password_env": password_env, "namespace": namespace}.items() if v}
    try:
        cfg = StateConfig.model_validate(fields)
    except ValidationError as e:  # its text would echo the input: a DSN with a password in it
        raise _fail("; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())) from None
    if not cfg.dsn:
        raise _fail("no PostgreSQL to migrate into: give --to postgresql://user@host:5432/db "
                    "or set state.dsn in the config")
    return cfg


@state_app.command("migrate")
def migrate_cmd(
    to: Annotated[str | None, typer.Option(
        "--to", help="postgresql://user@host:5432/db without a password (default: the config's state.dsn)")] = None,
    password_env: Annotated[str | None, typer.Option(
        "--password-env", help="env var holding the password (default: state.password_env; PGPASSWORD works)")] = None,
    namespace: Annotated[str | None, typer.Option(help="schema prefix (default: state.namespace)")] = None,
    source: Annotated[Path | None, typer.Option(
        "--from", help="storage root holding the SQLite state (default: the config's storage_root)")] = None,
    skills_to: Annotated[str | None, typer.Option(
        "--skills-to", help="the cluster's storage_root (s3://bucket/prefix): publish the skill library "
                            "(texts, metadata, generation, history) there as a snapshot")] = None,
    config: ConfigOpt = None,
) -> None:
    """Copy the embedded state (sessions and outbox, replay, run lock, OMLS/Controller state, memory) into
    PostgreSQL, idempotently, and check every table's rows afterwards; with --skills-to, publish the skill
    library into the cluster's bucket too. Stop clawray first."""
    cfg = load_config(config)
    target = target_config(cfg.state, to, password_env, namespace)
    root = source or cfg.storage_path()
    if not any(s.path.is_file() for s in embedded_stores(root)):
        raise _fail(f"no embedded state under {root}: none of "
                    + ", ".join(str(s.path.relative_to(root)) for s in embedded_stores(root))
                    + " (--from names the storage root that holds it)")
    import psycopg

    try:
        with out.status("migrating…") as status:
            results = migrate(root, target, progress=status.update)
    except (DatabaseError, MigrationError, ConfigError) as e:
        raise _fail(str(e)) from None
    except psycopg.Error as e:  # a row PostgreSQL refused: that store's copy rolled back, the rest stands
        raise _fail(f"the copy failed ({type(e).__name__}: {str(e).strip().splitlines()[0]}); stores copied "
                    "before it are kept, re-running copies the rest") from None
    out.print(_results_table(results, root, target))
    for line in not_copied(root):
        out.print(f"[dim]not copied:[/] {escape(line)}", soft_wrap=True)
    bad = [r for r in results if not r.ok]
    if bad:
        raise _fail("count mismatch: " + "; ".join(
            f"{r.store}.{r.table}: {r.source_rows - r.present} of {r.source_rows} source rows are not in "
            "PostgreSQL under their keys" for r in bad)
            + " (the target namespace held other rows with the same unique values? use a fresh --namespace)")
    if skills_to:
        out.print(publish_skills(root, skills_to))
    out.print(f"[green]migrated[/]: every row is in {escape(redact_dsn(target.dsn or ''))} "
              f"(namespace {target.namespace}). Point the config at it: state.dsn, state.password_env, "
              "state.namespace; re-running this copies nothing new.")


def publish_skills(root: Path, blob_root: str) -> str:
    """Publish the skill library under `root` into `blob_root` as the Evolver would (evolve/mirror.py): a
    copy of the folder is merged with what the bucket already holds, then published as the next version
    if it differs. Idempotent: a second run finds the bucket's newest snapshot equal and publishes nothing.
    The source folder is never modified."""
    import shutil
    import tempfile

    from core.storage import StorageLayout, remote_scheme
    from evolve.mirror import SkillMirror

    if not remote_scheme(blob_root):
        raise _fail(f"--skills-to {blob_root!r}: give the cluster's object-storage root (s3://bucket/prefix)")
    skills = StorageLayout(root).skills
    if not skills.is_dir():
        return f"skills: no skill library under {root}"
    with tempfile.TemporaryDirectory(prefix="clawray-skills-") as tmp:
        work = Path(tmp) / "skills"
        shutil.copytree(skills, work, ignore=shutil.ignore_patterns(".lock", ".mirror.json", ".tmp-*"))
        try:
            mirror = SkillMirror(blob_root, work)
            mirror.pull()
            done = mirror.publish()
        except (OSError, RuntimeError) as e:
            raise _fail(f"publishing the skill library to {blob_root} failed: {e}") from None
    if done is None:
        return f"skills: {blob_root} already holds this library (version {mirror.version}); nothing published"
    rec = done.record
    return (f"skills: published to {blob_root} as version {rec['version']} (generation {rec['generation']}, "
            f"{len(rec['files'])} files)")


def _results_table(results: list[TableResult], root: Path, target: StateConfig) -> Table:
    t = Table(title=f"{root} -> {redact_dsn(target.dsn or '')} (namespace {target.namespace})")
    for col in ("store", "table", "SQLite rows", "copied now", "present in PostgreSQL", "PostgreSQL rows", "check"):
        t.add_column(col, justify="right" if "rows" in col or col in ("copied now", "present in PostgreSQL")
                     else "left")
    for r in results:
        check = "[green]ok[/]" if r.ok else f"[red]{r.source_rows - r.present} missing[/]"
        t.add_row(r.store, r.table, str(r.source_rows), str(r.copied), str(r.present), str(r.target_rows), check)
    return t


@state_app.command("check")
def check_cmd(config: ConfigOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Which backend the config selects, whether it is reachable, every store's tables and row counts."""
    cfg = load_config(config)
    root = cfg.storage_path()
    try:
        backend, stock = inventory(root, cfg.state)
    except (DatabaseError, ConfigError) as e:
        raise _fail(f"the state database is not reachable: {e}") from None
    warning = None
    if not cfg.state.dsn and is_network_fs(fstype := mount_fs_type(root)):
        warning = (f"the storage root {root} is on a network file system ({fstype}): the stores refuse to open "
                   "there; set state.dsn (docs/cluster.md)")
    if as_json:
        out.print_json(json.dumps({"backend": backend, "reachable": True, "warning": warning,
                                   "stores": [asdict(s) for s in stock]}))
        return
    t = Table(title=f"state: {backend}" + (" (reachable)" if cfg.state.dsn else ""))
    for col in ("store", "location", "table", "rows"):
        t.add_column(col, justify="right" if col == "rows" else "left", overflow="fold")
    for s in stock:
        if s.tables is None:
            t.add_row(s.store, s.location, "[dim](not created yet)[/]", "")
        for i, (table, rows) in enumerate((s.tables or {}).items()):
            t.add_row(s.store if i == 0 else "", s.location if i == 0 else "", table, str(rows))
    out.print(t)
    if warning:
        out.print(f"[red]warning:[/] {escape(warning)}", soft_wrap=True)
