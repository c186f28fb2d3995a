"""The storage root layout (DESIGN.md "State") and atomic, durable file writes shared by every plane.

Every rename that publishes something (a file, an adapter or skill folder) goes through `rename_durably`,
which fsyncs the parent directory after the rename: without it the new entry may vanish on power loss.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.contracts import ADAPTER_NAME_RE

log = logging.getLogger("clawray.storage")

TMP_PREFIX = ".tmp-"  # folders being written (a publish) or removed; never a version
TMP_GRACE_S = 3600.0  # a publish takes seconds: a temp folder untouched for an hour is a crashed writer's


REMOTE_SCHEMES = ("s3", "gs", "gcs")  # object-storage roots (core/blobs.py)


def remote_scheme(root: str) -> str | None:
    """The object-storage scheme of a storage root (`s3`, `gs`), None for a local folder; ValueError for
    another scheme or a URI without a bucket."""
    if "://" not in root:
        return None
    scheme, rest = root.split("://", 1)
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{root!r}: object storage must be one of "
                         f"{', '.join(s + '://' for s in REMOTE_SCHEMES)} (or use a local folder)")
    if not rest.split("/", 1)[0]:
        raise ValueError(f"{root!r} names no bucket ({scheme}://bucket/prefix)")
    return scheme


@dataclass(frozen=True)
class StorageLayout:
    """Folders under one storage root; each has exactly one owning plane.

    `blob_root`: the object-storage URI (`s3://bucket/prefix`) when the storage root is remote. Adapters
    and Ray Train checkpoints then live there (core/blobs.py, core/adapter_store.py) and `root` is local
    scratch on this host (adapter cache, step logs); None = everything under `root`, as on one machine."""

    root: Path
    blob_root: str | None = None

    @property
    def skills(self) -> Path:  # evolve/
        return self.root / "skills"

    @property
    def adapters(self) -> Path:  # train/ publishes, serve/ loads
        return self.root / "adapters"

    @property
    def checkpoints(self) -> Path:  # train/
        return self.root / "checkpoints"

    @property
    def replay(self) -> Path:  # train/ (Replay actor)
        return self.root / "replay"

    @property
    def sessions(self) -> Path:  # serve/ (session store, turn outbox)
        return self.root / "sessions"

    @property
    def control(self) -> Path:  # cluster/ (OMLS, controller state)
        return self.root / "control"

    @property
    def memory(self) -> Path:  # memory/ (memory units, ingestion inbox)
        return self.root / "memory"

    def ensure(self) -> StorageLayout:
        for p in (self.skills, self.adapters, self.checkpoints, self.replay, self.sessions, self.control,
                  self.memory):
            p.mkdir(parents=True, exist_ok=True)
        return self


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the entries renamed into (or out of) it survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_durably(src: Path, dst: Path) -> None:
    """`os.replace(src, dst)` (atomic; a non-empty `dst` folder is refused with OSError), then fsync the
    directories that changed: the rename itself is only durable once the parent is on disk."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)
    if Path(src).parent != Path(dst).parent:
        fsync_dir(Path(src).parent)


def durable_temp(folder: Path, data: bytes) -> Path:
    """`data` in a new fsynced temp file (mode 0644) of `folder`, for the caller to rename or link into
    place; the caller removes it if that fails."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; these files are meant to be read by other tools
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old or the new content, never a partial file; durable
    when it returns (file and parent directory fsynced)."""
    tmp = durable_temp(path.parent, data)
    try:
        rename_durably(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


# ------------------------------------------------------------------------------------ adapter folders
def adapters_to_remove(names: Iterable[str], keep: set[str], keep_newest: int) -> list[str]:
    """The version folders among `names` that the retention rule removes, oldest first (pure).

    The rule: a version stays when it is in `keep` (the serving side passes the active version, the
    versions activated recently by any replica, and every version this replica still has loaded,
    retiring ones included: they may still be serving requests) or is one of the `keep_newest` highest
    version numbers (published but not activated yet, or a rollback target). Every other
    `policy-vNNNN` goes. Names that are not versions (`active.json`, temp folders) are never listed.
    """
    versions = sorted((int(m.group(1)), n) for n in names if (m := ADAPTER_NAME_RE.fullmatch(n)))
    newest = {n for _, n in versions[max(0, len(versions) - keep_newest):]} if keep_newest > 0 else set()
    return [n for _, n in versions if n not in keep and n not in newest]


def remove_tree(path: Path) -> None:
    """Delete a folder so that no reader ever sees it half-deleted: rename it to a temp name, then
    delete; a crash in between leaves a temp folder that `remove_stale_temps` clears later."""
    trash = path.parent / f"{TMP_PREFIX}removed-{path.name}-{uuid.uuid4().hex[:8]}"
    rename_durably(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale_temps(folder: Path, grace_s: float = TMP_GRACE_S) -> list[str]:
    """Remove `.tmp-*` entries of `folder` untouched for more than `grace_s` (a crashed writer's)."""
    gone, now = [], time.time()
    for p in folder.iterdir() if folder.is_dir() else ():
        try:
            if not p.name.startswith(TMP_PREFIX) or now - p.lstat().st_mtime <= grace_s:
                continue
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
            gone.append(p.name)
        except OSError as e:  # gone meanwhile, or not ours to delete: the next pass tries again
            log.warning("cannot remove leftover %s: %s", p, e)
    return gone


def prune_adapters(adapters_dir: Path, keep: set[str], keep_newest: int) -> list[str]:
    """Remove the version folders `adapters_to_remove` names and stale temp folders; returns what went."""
    gone = remove_stale_temps(adapters_dir)
    names = [p.name for p in adapters_dir.iterdir()] if adapters_dir.is_dir() else []
    for name in adapters_to_remove(names, keep, keep_newest):
        try:
            remove_tree(adapters_dir / name)
            gone.append(name)
        except OSError as e:
            log.warning("cannot remove adapter folder %s: %s", name, e)
    return gone
