"""File-level pieces of the SkillBank: the cross-process lock, the generation file, the history log,
the metadata and history records it writes, and its result types.

Kept apart from bank.py so the bank reads as policy (what is accepted) over these mechanics.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.contracts import Skill
from core.storage import atomic_write_text

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
GENERATION_FILE = ".generation"
HISTORY_FILE = "history.jsonl"


# The bank's own keys of a history record; a caller's notes (summary, evidence, validation, base_version,
# anything else) are added beside them and never replace them.
CORE_KEYS = frozenset({"ts", "action", "name", "generation", "version", "evolver", "origin_sessions",
                       "category", "text", "sha256", "restored_version"})


class BankError(ValueError):
    """A bank operation that cannot be done (unknown or invalid name, unknown version); the message says
    why."""


@dataclass(frozen=True)
class Rejection:
    name: str
    reason: str


@dataclass
class BatchResult:
    """Outcome of one `add_batch` (or rollback). `generation` is the bank's generation after it."""

    accepted: list[str]  # new skills, updates and restores that changed content (these bumped the generation)
    rejected: list[Rejection]
    generation: int
    merged: list[str] = field(default_factory=list)  # same content, metadata only (no bump)
    conflicts: list[Rejection] = field(default_factory=list)  # changed since the caller's base: not written
    removed: list[str] = field(default_factory=list)  # removed by a library rollback
    unchanged: list[str] = field(default_factory=list)  # a rollback found the text already in place

    @property
    def changed(self) -> bool:
        return bool(self.accepted or self.removed)


def utc_now() -> str:
    """ISO 8601 UTC time with a `Z` suffix, second precision (what skill metadata stores)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now_ms() -> str:
    """ISO 8601 UTC time with a `Z` suffix, millisecond precision (history records' `ts`)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class FileLock:
    """An exclusive lock over `path` shared by threads of this process and other processes on this host.

    NOTE: flock(2) is per host; on a shared mount across nodes (NFS) it may not exclude other nodes,
    which is why one Evolver actor is the only writer of a cluster's skill bank.
    """

    def __init__(self, path: Path):
        self.path = path
        self._thread_lock = threading.Lock()

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


class GenerationFile:
    """`root/.generation`: one integer, written atomically, only ever increased."""

    def __init__(self, path: Path):
        self.path = path

    def read_raw(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None

    def parse(self, raw: str | None) -> int | None:
        """The generation in `raw`; 0 when the file is missing; None when it is malformed."""
        if raw is None:
            return 0
        try:
            value = int(raw)
        except ValueError:
            return None
        return value if value >= 0 else None

    def write(self, generation: int) -> None:
        atomic_write_text(self.path, f"{generation}\n")


class HistoryLog:
    """`root/history.jsonl`: one JSON object per change, appended under the bank lock.

    Readers follow it by byte offset: `read_from(offset)` returns complete lines only, so a reader racing
    a writer never sees half a record.
    """

    def __init__(self, path: Path):
        self.path = path

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def append(self, records: list[dict[str, Any]]) -> int:
        """Append `records` durably (one write + fsync); returns the new file size."""
        data = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            return f.tell()

    def read_from(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """(records after byte `offset`, offset after the last complete line)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], 0
        end = data.rfind(b"\n") + 1
        return self._parse(data[:end]), offset + end

    def read_all(self) -> list[dict[str, Any]]:
        return self.read_from(0)[0]

    def _parse(self, data: bytes) -> list[dict[str, Any]]:
        out = []
        for n, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                log.warning("%s: skipping a malformed history line (%d in this read)", self.path, n)
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def max_generation(self) -> int:
        """Largest generation any record carries (used to recover a damaged generation file)."""
        return max((int(r.get("generation", 0) or 0) for r in self.read_all()), default=0)


def stamp_metadata(skill: Skill, old: Skill | None, action: str, origins: list[str], evolver: str,
                   generation: int, max_origins: int, version: int) -> dict[str, Any]:
    """The metadata a skill is written with: bank fields over `old`'s and `skill`'s own metadata.

    `action` is "add" (new), "update" (content changed) or "merge" (same content: evolver and generation
    of the last content change are kept). `version` is the skill's version after this write (the bank
    counts it: see `SkillBank.version_of`). Origin session ids are the union of old, given and the
    skill's own, the most recent `max_origins` kept.
    """
    old_meta = old.metadata if old is not None and action != "add" else {}
    meta: dict[str, Any] = {**old_meta, **skill.metadata}
    seen = dict.fromkeys([*(old_meta.get("origin_sessions") or []),
                          *(skill.metadata.get("origin_sessions") or []), *origins])
    meta["origin_sessions"] = [str(s) for s in seen][-max_origins:]
    now = utc_now()
    merge = action == "merge"
    meta["version"] = version
    meta["created_at"] = old_meta.get("created_at") or now
    meta["updated_at"] = now
    meta["evolver"] = old_meta.get("evolver", evolver) if merge else evolver
    meta["generation"] = old_meta.get("generation", generation) if merge else generation
    return meta


def history_record(skill: Skill, action: str, evolver: str, origins: list[str], text: str | None = None,
                   note: dict[str, Any] | None = None) -> dict[str, Any]:
    """One history.jsonl line for a written skill (its metadata already stamped). `text`: the SKILL.md
    written (kept with its sha256 so the version can be shown and restored); `note`: the caller's
    fields (summary, evidence, validation, base_version), never replacing the bank's own."""
    rec = {"ts": utc_now_ms(), "action": action, "name": skill.name,
           "generation": skill.metadata.get("generation", 0), "version": skill.metadata["version"],
           "evolver": evolver, "origin_sessions": origins, "category": skill.category}
    if text is not None:
        rec["text"], rec["sha256"] = text, sha256_text(text)
    for key, value in (note or {}).items():
        if key not in CORE_KEYS and value is not None:
            rec[str(key)] = value
    return rec
