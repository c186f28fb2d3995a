"""A training run's own records: the step log, the discard log and "latest", its newest persisted checkpoint.

Rank 0 writes them (train/grpo.py); the driver reads the steps and discards back into its `TrainResult`
(train/job.py) and every worker reads "latest" when it restores. `run_files(storage, run)` picks the
layout from the storage root, as `core.adapter_store.adapter_store` does:

`LocalRunFiles` (a local storage root, one machine): files under `checkpoints/`, as always
    <run>.steps.jsonl        one JSON line per trained step (sample ids, lease, adapter, metrics)
    <run>.discarded.jsonl    one per discarded step (lease, sample ids, why the seal was refused)
    <run>.latest.json        {"step", "dir", "lease_id"}, replaced atomically

`RemoteRunFiles` (`storage_root: s3://...`, `gs://...`): Ray Train places rank 0 on any node, and that
node's local scratch is no other host's (the driver would see no steps; a restart elsewhere would miss
the newer checkpoint). So the records go to the bucket, under `runs/<run>/`:
    steps/<n>.json           one object per trained step, n = 1, 2, ... zero-padded (sorted = in order)
    discarded/<n>.json       one per discarded step
    latest/<n>.json          a log of {"step", "dir", "lease_id"}; its newest entry is "latest" (the
                             newest LATEST_KEEP stay)
An object cannot be appended to, so a log is numbered objects, each created create-only
(`BlobStore.write_new`) at the number after the last one listed: a writer that loses a number to another
takes the next one, so no record ever replaces another.

Why the bucket and not the control store (core/kv.py, PostgreSQL with `state.dsn`): the records point at
checkpoints that are in the bucket and live and go with them, and every Train worker already reaches the
bucket (the driver passes the endpoint on, credentials come from each node's env or role), whereas the
database would also need the dsn and its password env var on every worker node.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.blobs import BlobStore
from core.storage import StorageLayout, atomic_write_json, read_json

RUNS = "runs"
CHECKPOINTS = "checkpoints"  # where core/blobs.py `checkpoint_storage` points Ray Train: <run>/<dir>/
ENTRY_RE = re.compile(r"^(\d{12})\.json$")
LATEST_KEEP = 4  # "latest" entries kept; a restore only reads the newest
MAX_TRIES = 100


def step_log_path(storage: StorageLayout, run_name: str) -> Path:
    """A local root's step log: JSON lines, one per trained step of the run."""
    return storage.checkpoints / f"{run_name}.steps.jsonl"


def discard_log_path(storage: StorageLayout, run_name: str) -> Path:
    """A local root's discard log: JSON lines, one per discarded step of the run."""
    return storage.checkpoints / f"{run_name}.discarded.jsonl"


def latest_checkpoint_path(storage: StorageLayout, run_name: str) -> Path:
    """A local root's "latest": {"step", "dir", "lease_id"} of the run's newest persisted checkpoint."""
    return storage.checkpoints / f"{run_name}.latest.json"


class LocalLog:
    """A JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def read(self, since: int = 0) -> list[dict[str, Any]]:
        """The records after the first `since`, oldest first."""
        if not self.path.exists():
            return []
        lines = [x for x in self.path.read_text(encoding="utf-8").splitlines() if x.strip()]
        return [json.loads(x) for x in lines[since:]]

    def count(self) -> int:
        return len(self.read())


class RemoteLog:
    """Numbered objects under `prefix`, each created once (see the module doc)."""

    def __init__(self, blobs: BlobStore, prefix: str) -> None:
        self.blobs, self.prefix = blobs, prefix

    def _keys(self) -> list[str]:
        return [f"{self.prefix}/{n}" for n in self.blobs.list(self.prefix) if ENTRY_RE.fullmatch(n)]

    def append(self, record: dict[str, Any]) -> None:
        data = json.dumps(record).encode()
        for _ in range(MAX_TRIES):
            keys = self._keys()
            last = int(ENTRY_RE.fullmatch(keys[-1].rsplit("/", 1)[-1]).group(1)) if keys else 0
            if self.blobs.write_new(f"{self.prefix}/{last + 1:012d}.json", data):
                return
        raise RuntimeError(f"could not append to {self.blobs.uri(self.prefix)}")

    def read(self, since: int = 0) -> list[dict[str, Any]]:
        """The records after the first `since`, oldest first (a log that is never trimmed)."""
        out = []
        for key in self._keys()[since:]:
            raw = self.blobs.read(key)
            if raw is None:
                raise RuntimeError(f"{self.blobs.uri(key)} was listed but is gone")
            out.append(json.loads(raw))
        return out

    def count(self) -> int:
        return len(self._keys())

    def newest(self) -> dict[str, Any]:
        """The newest record, {} when there is none."""
        for _ in range(MAX_TRIES):
            keys = self._keys()
            if not keys:
                return {}
            raw = self.blobs.read(keys[-1])
            if raw is not None:  # else trimmed between list and read (newer entries exist): list again
                return json.loads(raw)
        raise RuntimeError(f"cannot read the newest entry of {self.blobs.uri(self.prefix)}")

    def trim(self, keep: int) -> None:
        for key in self._keys()[:-keep]:
            self.blobs.delete(key)


class LocalRunFiles:
    """The run's files under a local root's `checkpoints/` folder."""

    def __init__(self, storage: StorageLayout, run_name: str) -> None:
        self.storage, self.run_name = storage, run_name
        self.steps = LocalLog(step_log_path(storage, run_name))
        self.discards = LocalLog(discard_log_path(storage, run_name))

    def latest(self) -> dict[str, Any]:
        return read_json(latest_checkpoint_path(self.storage, self.run_name), {}) or {}

    def set_latest(self, record: dict[str, Any]) -> None:
        atomic_write_json(latest_checkpoint_path(self.storage, self.run_name), record)

    @contextmanager
    def checkpoint(self, name: str) -> Iterator[Path | None]:
        """The run's persisted checkpoint folder `name`, None when it is not there."""
        d = self.storage.checkpoints / self.run_name / name
        yield d if d.is_dir() else None


class RemoteRunFiles:
    """The run's records under the bucket's `runs/<run>/` (see the module doc)."""

    def __init__(self, storage: StorageLayout, run_name: str) -> None:
        self.blobs, self.run_name = BlobStore(storage.blob_root), run_name
        self.steps = RemoteLog(self.blobs, f"{RUNS}/{run_name}/steps")
        self.discards = RemoteLog(self.blobs, f"{RUNS}/{run_name}/discarded")
        self._latest = RemoteLog(self.blobs, f"{RUNS}/{run_name}/latest")

    def latest(self) -> dict[str, Any]:
        return self._latest.newest()

    def set_latest(self, record: dict[str, Any]) -> None:
        self._latest.append(record)
        self._latest.trim(LATEST_KEEP)

    @contextmanager
    def checkpoint(self, name: str) -> Iterator[Path | None]:
        """A local copy of the run's persisted checkpoint `name` (removed on exit), None when the bucket
        has nothing under it."""
        with tempfile.TemporaryDirectory(prefix="clawray-restore-") as tmp:
            try:
                d = self.blobs.get_tree(f"{CHECKPOINTS}/{self.run_name}/{name}", Path(tmp) / name)
            except FileNotFoundError:
                d = None
            yield d


def run_files(storage: StorageLayout, run_name: str) -> LocalRunFiles | RemoteRunFiles:
    """The run's records: in the bucket when the storage root is object storage, else local files."""
    if storage.blob_root is None:
        return LocalRunFiles(storage, run_name)
    return RemoteRunFiles(storage, run_name)
