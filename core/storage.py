"""The storage root layout (DESIGN.md "State") and atomic file writes shared by every plane."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StorageLayout:
    """Folders under one storage root; each has exactly one owning plane."""

    root: Path

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

    def ensure(self) -> StorageLayout:
        for p in (self.skills, self.adapters, self.checkpoints, self.replay, self.sessions, self.control):
            p.mkdir(parents=True, exist_ok=True)
        return self


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old or the new content, never a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; these files are meant to be read by other tools
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
