"""Set up, restore and inspect an agent's config, with a byte-exact backup.

`setup` computes every new file first (a file in an unknown format stops it before anything is written),
then saves what each file was (its exact bytes and mode, or that it did not exist) under
`~/.clawray/agent-backups/<agent>/`, then writes. A second `setup` keeps the first backup, so `restore`
always returns the state from before clawray was set up: the original bytes, or no file at all (and no
folders that setup created). Writes are atomic (temporary file + rename) and go through symlinks to
their target, so a dotfile manager's link stays a link.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import formats
from agents.base import Agent, ConfigFile
from agents.target import Target

BACKUPS = Path(".clawray") / "agent-backups"
MANIFEST = "manifest.json"


class AgentSetupError(Exception):
    """Setup or restore cannot go ahead; nothing was changed."""


@dataclass(frozen=True)
class Planned:
    file: ConfigFile
    real: Path  # the path written (symlinks resolved)
    before: bytes | None  # None: the file does not exist
    after: bytes


@dataclass(frozen=True)
class FileStatus:
    path: Path
    exists: bool
    backed_up: bool  # clawray setup is active for this file
    changed_since_setup: bool  # its bytes differ from what setup wrote (the agent or the user edited it)


def backup_dir(home: Path, agent: Agent) -> Path:
    return home / BACKUPS / agent.name


def _sha(b: bytes | None) -> str | None:
    return hashlib.sha256(b).hexdigest() if b is not None else None


def _read(p: Path) -> bytes | None:
    try:
        return p.read_bytes()
    except FileNotFoundError:
        return None


def plan(agent: Agent, home: Path, env: Mapping[str, str], target: Target) -> list[Planned]:
    """The new bytes of every file the agent's setup writes; raises AgentSetupError for a file it cannot
    edit (not UTF-8, not in the agent's format, or not a regular file)."""
    out = []
    for f in agent.files(home, env, target):
        real = Path(os.path.realpath(f.path))
        if real.exists() and not real.is_file():
            raise AgentSetupError(f"{f.path} is not a regular file")
        before = _read(real)
        try:
            text = before.decode("utf-8") if before is not None else ""
            doc = formats.load(f.fmt, text)
            after = formats.render(f.fmt, text, doc, f.edit(doc, target)).encode("utf-8")
        except UnicodeDecodeError:
            raise AgentSetupError(f"{f.path}: not UTF-8 text; left it untouched") from None
        except formats.FormatError as e:
            raise AgentSetupError(f"{f.path}: unknown format for {agent.title} ({e}); left it untouched. "
                                  f"Fix or move the file, then run setup again") from None
        out.append(Planned(f, real, before, after))
    return out


def load_manifest(home: Path, agent: Agent) -> dict[str, Any] | None:
    p = backup_dir(home, agent) / MANIFEST
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".clawray-tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _missing_dirs(path: Path) -> list[Path]:
    """The folders above `path` that do not exist yet, outermost first."""
    out = []
    for parent in path.parents:
        if parent.exists():
            break
        out.append(parent)
    return out[::-1]


def _new_mode(secret: bool) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o600 if secret else 0o666 & ~umask


def setup(agent: Agent, home: Path, env: Mapping[str, str], target: Target) -> list[Planned]:
    planned = plan(agent, home, env, target)
    bdir = backup_dir(home, agent)
    manifest = load_manifest(home, agent) or {"agent": agent.name, "files": []}
    known = {e["path"] for e in manifest["files"]}
    new_entries = []
    for p in planned:
        if str(p.real) in known:
            continue  # backed up by an earlier setup: that copy is the original
        entry = {"path": str(p.real), "existed": p.before is not None,
                 "mode": p.real.stat().st_mode & 0o7777 if p.before is not None else None,
                 "created_dirs": [str(d) for d in _missing_dirs(p.real)],
                 "backup": f"{len(manifest['files']) + len(new_entries)}.orig"}
        new_entries.append((entry, p.before))
    # The backups are durable before the first config byte changes.
    bdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for entry, before in new_entries:
        if before is not None:
            _write_atomic(bdir / entry["backup"], before, 0o600)
        manifest["files"].append(entry)
    by_path = {e["path"]: e for e in manifest["files"]}
    for p in planned:
        by_path[str(p.real)]["written_sha256"] = _sha(p.after)
    _write_atomic(bdir / MANIFEST, json.dumps(manifest, indent=2).encode(), 0o600)
    for p in planned:
        p.real.parent.mkdir(parents=True, exist_ok=True)
        mode = p.real.stat().st_mode & 0o7777 if p.before is not None else _new_mode(p.file.secret)
        _write_atomic(p.real, p.after, mode)
    return planned


def restore(agent: Agent, home: Path) -> list[tuple[Path, str]]:
    """Put every file back as it was before the first setup; returns (path, what was done)."""
    manifest = load_manifest(home, agent)
    if manifest is None:
        raise AgentSetupError(f"clawray setup is not active for {agent.name}: nothing to restore")
    bdir = backup_dir(home, agent)
    done = []
    for e in manifest["files"]:
        path = Path(e["path"])
        # Edits made after setup (by the user or the agent) are dropped: say so.
        note = " (dropping changes made since setup)" if _sha(_read(path)) != e.get("written_sha256") else ""
        if e["existed"]:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, (bdir / e["backup"]).read_bytes(), e["mode"])
            done.append((path, "restored" + note))
            continue
        path.unlink(missing_ok=True)
        done.append((path, "removed, as before setup" + note))
        for d in reversed(e["created_dirs"]):  # innermost first; a folder the agent filled since stays
            try:
                Path(d).rmdir()
            except OSError:
                break
    for e in manifest["files"]:
        (bdir / e["backup"]).unlink(missing_ok=True)
    (bdir / MANIFEST).unlink()
    bdir.rmdir()
    try:
        bdir.parent.rmdir()  # agent-backups/, once no agent is set up
    except OSError:
        pass  # another agent's backup is still there
    return done


def status(agent: Agent, home: Path, env: Mapping[str, str], target: Target) -> list[FileStatus]:
    manifest = load_manifest(home, agent) or {"files": []}
    by_path = {e["path"]: e for e in manifest["files"]}
    out = []
    for f in agent.files(home, env, target):
        real = Path(os.path.realpath(f.path))
        entry = by_path.get(str(real))
        data = _read(real)
        out.append(FileStatus(f.path, data is not None, entry is not None,
                              entry is not None and entry.get("written_sha256") != _sha(data)))
    return out
