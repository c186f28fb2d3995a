"""`clawray skills ...`: inspect and edit the skill library of a storage root.

A typer sub-app; the composition-root CLI (cluster/) mounts it with `app.add_typer(skills_app,
name="skills")`. It works on the files directly (no cluster needed): the SkillBank's lock makes it safe
next to a running Evolver, and Proxies pick changes up within `skills.refresh_s`. With an object-storage
root (`s3://...`) it works, from any host, on the newest snapshot in the bucket (evolve/mirror.py), pulled
into a temporary folder; `add`, `remove` and `rollback` publish the result as the next version (merged
with whatever an Evolver published meanwhile).

    clawray skills [--config FILE] list | show NAME | log [-n N] | add PATH | remove NAME
                                   | history [NAME] [-n N] | diff NAME [V1] [V2]
                                   | rollback NAME --to V | rollback --generation G | rollback --at ISO

Versions come from history.jsonl, which keeps the full SKILL.md of every add, update and rollback
(evolve/versions.py); a rollback writes that stored text back byte for byte as a new version.

Errors print one line (`error: ...`) and exit with status 1; no tracebacks.
"""

from __future__ import annotations

import difflib
import getpass
import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from core.cli_common import err, keep_config
from core.cli_common import fail as _fail
from core.config import ConfigError, load_config
from core.contracts import SKILL_NAME_RE
from core.storage import StorageLayout
from evolve.bank import BankError, SkillBank
from evolve.mirror import SkillMirror, SnapshotError
from evolve.skill_md import SkillFormatError, parse_skill_md, render_skill_md

skills_app = typer.Typer(name="skills", help="Inspect and edit the skill library.", no_args_is_help=True,
                         add_completion=False, pretty_exceptions_enable=False)
out = Console()


skills_app.callback()(keep_config)


BUCKET_ERRORS = (OSError, SnapshotError, RuntimeError)  # s3fs raises OSError subclasses


def operator() -> str:
    """Who changed the library by hand, for the audit trail (`evolver` of the history record): the OS user
    and host running the command, since several hosts can edit one library in a bucket."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (e.g. a container user): the uid itself
        user = str(os.getuid())
    return f"manual:{user}@{socket.gethostname()}"


@dataclass
class Library:
    bank: SkillBank
    where: str  # for titles: the folder, or the bucket and version
    mirror: SkillMirror | None  # set when the library lives in the bucket

    def publish(self) -> str:
        """Publish a change made through `bank` (bucket only); the suffix for the command's message."""
        if self.mirror is None:
            return ""
        try:
            out = self.mirror.publish()
        except BUCKET_ERRORS as e:
            raise _fail(f"cannot publish to {self.where}: {e}") from None
        if out is None:
            return ""
        self.bank.reload()  # a merge with another writer's version moves the generation past both
        return f"; published as version {out.record['version']}"


@contextmanager
def _library(ctx: typer.Context) -> Iterator[Library]:
    try:
        cfg = load_config(ctx.obj)
        root = StorageLayout(cfg.storage_path()).skills
        uri = cfg.blob_root()
    except ConfigError as e:
        raise _fail(str(e)) from None
    if uri is None:
        try:
            bank = SkillBank(root, cfg.skills)
        except OSError as e:
            raise _fail(f"cannot open the skill library at {root}: {e}") from None
        yield Library(bank, str(root), None)
        return
    with tempfile.TemporaryDirectory(prefix="clawray-skills-") as tmp:
        try:
            mirror = SkillMirror(uri, Path(tmp) / "skills")
            mirror.pull()
        except BUCKET_ERRORS as e:
            raise _fail(f"cannot read the skill library from {uri}/skills: {e}") from None
        yield Library(SkillBank(mirror.folder, cfg.skills), f"{uri}/skills v{mirror.version}", mirror)


def _short(text: str, n: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


@skills_app.command("list")
def list_skills(ctx: typer.Context) -> None:
    """List the skills (and any malformed folders that were skipped)."""
    with _library(ctx) as lib:
        bank = lib.bank
        table = Table(title=f"{len(bank)} skills · generation {bank.generation} · {lib.where}")
        for col in ("name", "category", "version", "updated", "description"):
            table.add_column(col, overflow="fold")
        for s in bank.skills():
            table.add_row(s.name, s.category, str(s.metadata.get("version", "")),
                          str(s.metadata.get("updated_at", "")), _short(s.description, 80))
        out.print(table)
        for folder, why in sorted(bank.problems.items()):
            err.print(f"[yellow]skipped[/yellow] {escape(folder)}: {escape(why)}", highlight=False)


@skills_app.command("show")
def show(ctx: typer.Context, name: Annotated[str, typer.Argument(help="skill name")]) -> None:
    """Print one skill's SKILL.md."""
    with _library(ctx) as lib:
        skill, why = lib.bank.get(name), lib.bank.problems.get(name)
    if skill is None:
        raise _fail(f"skill {name!r} is malformed: {why}" if why else f"no skill named {name!r}")
    out.print(render_skill_md(skill), markup=False, highlight=False)


@skills_app.command("log")
def log_cmd(ctx: typer.Context, n: Annotated[int, typer.Option(
        "--limit", "-n", min=1, help="how many recent changes")] = 20) -> None:
    """Show the most recent changes (history.jsonl)."""
    with _library(ctx) as lib:
        generation, history = lib.bank.generation, lib.bank.history(n)
    table = Table(title=f"last {n} changes · generation {generation}")
    for col in ("time", "action", "name", "gen", "ver", "evolver", "origin sessions"):
        table.add_column(col, overflow="fold")
    for r in history:
        origins = [str(o) for o in r.get("origin_sessions") or []]
        table.add_row(str(r.get("ts", "")), str(r.get("action", "")), str(r.get("name", "")),
                      str(r.get("generation", "")), str(r.get("version", "")), str(r.get("evolver", "")),
                      _short(", ".join(origins), 40))
    out.print(table)


@skills_app.command("add")
def add(ctx: typer.Context, path: Annotated[Path, typer.Argument(help="a skill folder or its SKILL.md")],
        update: Annotated[bool, typer.Option("--update", help="replace a skill of the same name")] = False,
        ) -> None:
    """Add a skill from a folder (containing SKILL.md) or a SKILL.md file."""
    file = path / "SKILL.md" if path.is_dir() else path
    try:
        skill = parse_skill_md(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(f"cannot read {file}: {e}") from None
    except SkillFormatError as e:
        raise _fail(f"{file}: {e}") from None
    with _library(ctx) as lib:
        existed = skill.name in lib.bank
        result = lib.bank.add(skill, evolver=operator(), allow_updates=update)
        if result.rejected:
            raise _fail(f"{skill.name}: {result.rejected[0].reason}")
        published = lib.publish()
        verb = "unchanged (metadata merged)" if result.merged else "updated" if existed else "added"
        out.print(f"{skill.name}: {verb}; generation {lib.bank.generation}{published}", highlight=False)


@skills_app.command("remove")
def remove(ctx: typer.Context, name: Annotated[str, typer.Argument(help="skill name")]) -> None:
    """Delete a skill (its folder) and bump the generation."""
    with _library(ctx) as lib:
        try:
            lib.bank.remove(name, evolver=operator())
        except BankError as e:
            raise _fail(str(e)) from None
        published = lib.publish()
        out.print(f"{name}: removed; generation {lib.bank.generation}{published}", highlight=False)


@skills_app.command("history")
def history_cmd(ctx: typer.Context,
                name: Annotated[str | None, typer.Argument(help="only this skill's changes")] = None,
                n: Annotated[int, typer.Option("--limit", "-n", min=1, help="how many recent changes")] = 20,
                ) -> None:
    """Show the audit trail: who changed what, when, as which version and generation, and why."""
    if name is not None and not SKILL_NAME_RE.fullmatch(name):
        raise _fail(f"invalid skill name {name!r}: must match {SKILL_NAME_RE.pattern}")
    with _library(ctx) as lib:
        generation, records = lib.bank.generation, lib.bank.history()
        exists = name is not None and name in lib.bank
    if name is not None:
        records = [r for r in records if r.get("name") == name]
        if not records and not exists:
            raise _fail(f"no history for skill {name!r}")
    records = records[-n:]
    table = Table(title=f"{'history of ' + name if name else 'history'} · last {len(records)} · "
                        f"generation {generation}")
    for col in ("ts", "action", "name", "ver", "gen", "evolver", "summary"):
        table.add_column(col, overflow="fold", no_wrap=col in ("ts", "action", "ver", "gen"))
    for r in records:
        summary = r.get("summary") or (f"restored version {r['restored_version']}"
                                       if r.get("restored_version") else "")
        table.add_row(str(r.get("ts", "")), str(r.get("action", "")), str(r.get("name", "")),
                      str(r.get("version", "")), str(r.get("generation", "")), str(r.get("evolver", "")),
                      _short(str(summary), 60))
    out.print(table)


@skills_app.command("diff")
def diff_cmd(ctx: typer.Context, name: Annotated[str, typer.Argument(help="skill name")],
             v1: Annotated[int | None, typer.Argument(help="from this version (default: the previous)")] = None,
             v2: Annotated[int | None, typer.Argument(help="to this version (default: the latest)")] = None,
             ) -> None:
    """Unified diff between two stored versions of a skill (default: previous vs latest)."""
    with _library(ctx) as lib:
        try:
            stored = [int(r.get("version") or 0) for r in lib.bank.versions(name) if r.get("action") != "remove"]
            numbers = list(dict.fromkeys(sorted(stored)))
            if not numbers:
                raise BankError(f"no stored versions of skill {name!r} (not in history.jsonl)")
            if v1 is None:
                if len(numbers) < 2:
                    raise BankError(f"skill {name!r} has only version {numbers[0]}: nothing to compare")
                v1, v2 = numbers[-2], numbers[-1]
            v2 = numbers[-1] if v2 is None else v2
            a, b = lib.bank.text_at(name, v1), lib.bank.text_at(name, v2)
        except BankError as e:
            raise _fail(str(e)) from None
    diff = "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        f"{name} v{v1}", f"{name} v{v2}"))
    typer.echo(diff if diff else f"{name}: versions {v1} and {v2} are identical", nl=not diff)


@skills_app.command("rollback")
def rollback_cmd(
        ctx: typer.Context,
        name: Annotated[str | None, typer.Argument(help="the skill (omit it to roll back the whole library)")] = None,
        to: Annotated[int | None, typer.Option("--to", help="restore this version of NAME")] = None,
        generation: Annotated[int | None, typer.Option(
            "--generation", "-g", help="restore the whole library as it was at this generation")] = None,
        at: Annotated[str | None, typer.Option(
            "--at", help="restore the whole library as it was at this ISO 8601 time (UTC if no zone)")] = None,
) -> None:
    """Restore a stored version of a skill, or the whole library as of a generation or time, as new
    versions (+1 generation); skill folders added by hand are never removed."""
    given = [flag for flag, v in (("--to", to), ("--generation", generation), ("--at", at)) if v is not None]
    if len(given) != 1:
        raise _fail(f"give exactly one of --to, --generation, --at (got {' and '.join(given) or 'none'})")
    if to is not None and name is None:
        raise _fail("--to needs the skill NAME: clawray skills rollback NAME --to V")
    if to is None and name is not None:
        raise _fail(f"{given[0]} rolls back the whole library: drop {name!r}, or use NAME --to V")
    point = f"version {to}" if to is not None else f"generation {generation}" if generation is not None else at
    with _library(ctx) as lib:
        try:
            result = lib.bank.rollback(name, to, operator()) if name is not None and to is not None \
                else lib.bank.rollback_library(generation, at, operator())
        except BankError as e:
            raise _fail(str(e)) from None
        if name is not None and result.rejected:
            raise _fail(f"{name}: {result.rejected[0].reason}")
        for r in result.rejected:
            err.print(f"[yellow]skipped[/yellow] {escape(r.name)}: {escape(r.reason)}", highlight=False,
                      soft_wrap=True)
        if not result.changed:
            what = f"{name}: already holds the text of" if name is not None else "library: already as at"
            out.print(f"{what} {point}; nothing changed; generation {lib.bank.generation}", highlight=False,
                      soft_wrap=True)
            return
        published = lib.publish()
        if name is not None:
            msg = f"{name}: rolled back to {point} (now version {lib.bank.version_of(name)})"
        else:
            parts = [f"restored {', '.join(result.accepted)}" if result.accepted else "",
                     f"removed {', '.join(result.removed)}" if result.removed else ""]
            msg = f"library rolled back to {point}: {'; '.join(p for p in parts if p)}"
        out.print(f"{msg}; generation {lib.bank.generation}{published}", highlight=False, soft_wrap=True)


def main() -> None:  # `python -m evolve.cli` until the cluster CLI mounts the sub-app
    skills_app()


if __name__ == "__main__":
    main()
