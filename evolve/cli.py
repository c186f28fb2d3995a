"""`clawray skills ...`: inspect and edit the skill library of a storage root.

A typer sub-app; the composition-root CLI (cluster/) mounts it with `app.add_typer(skills_app,
name="skills")`. It works on the files directly (no cluster needed): the SkillBank's lock makes it safe
next to a running Evolver, and Proxies pick changes up within `skills.refresh_s`. With an object-storage
root (`s3://...`) it works, from any host, on the newest snapshot in the bucket (evolve/mirror.py), pulled
into a temporary folder; `add` and `remove` publish the result as the next version (merged with whatever
an Evolver published meanwhile).

    clawray skills [--config FILE] list | show NAME | log [-n N] | add PATH | remove NAME

Errors print one line (`error: ...`) and exit with status 1; no tracebacks.
"""

from __future__ import annotations

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
from core.storage import StorageLayout
from evolve.bank import BankError, SkillBank
from evolve.mirror import SkillMirror, SnapshotError
from evolve.skill_md import SkillFormatError, parse_skill_md, render_skill_md

skills_app = typer.Typer(name="skills", help="Inspect and edit the skill library.", no_args_is_help=True,
                         add_completion=False, pretty_exceptions_enable=False)
out = Console()


skills_app.callback()(keep_config)


BUCKET_ERRORS = (OSError, SnapshotError, RuntimeError)  # s3fs raises OSError subclasses


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
        result = lib.bank.add(skill, evolver="manual", allow_updates=update)
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
            lib.bank.remove(name)
        except BankError as e:
            raise _fail(str(e)) from None
        published = lib.publish()
        out.print(f"{name}: removed; generation {lib.bank.generation}{published}", highlight=False)


def main() -> None:  # `python -m evolve.cli` until the cluster CLI mounts the sub-app
    skills_app()


if __name__ == "__main__":
    main()
