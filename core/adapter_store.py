"""Where LoRA versions are published and which one serving activates, on a local folder or object storage.

The trainer publishes (train/publish.py); every engine replica loads, activates and prunes
(serve/engine.py). Both see one interface with two layouts under the storage root's `adapters/`:

`LocalAdapters` (a local storage root, the default) keeps the layout of one machine:
    adapters/policy-vNNNN/          the version folder, renamed into place whole by the publish
    adapters/active.json            {"active", "recent"}, replaced atomically

`RemoteAdapters` (`s3://bucket/prefix`, `gs://...`): objects cannot be renamed, so
    adapters/policy-vNNNN-<hex>/    the version's files, uploaded under a key no one else writes
    adapters/policy-vNNNN.json      its record {name, version, key, manifest}, written create-only AFTER
                                    the upload: the record IS the publish. Two publishers that chose the
                                    same N cannot both win: one create succeeds, the other gets 412,
                                    deletes its upload and tries N+1. A version is never overwritten.
    adapters/active/<seq>.json      the active pointer, a log of {seq, active, recent}: a switch reads
                                    entry `seq` and creates `seq + 1` create-only, so two replicas that
                                    switch at once are ordered, never lost (a version in `recent` keeps its
                                    files: another replica may still serve it). The newest LOG_KEEP stay.
    vLLM needs a local path: `folder()` copies a version into `<local root>/adapters/policy-vNNNN-<hex>/`
    (local scratch under cache_dir) first; pruning removes copies of versions that are gone.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.blobs import BlobStore
from core.contracts import ADAPTER_NAME_RE, adapter_name, parse_adapter_name
from core.storage import (
    TMP_GRACE_S,
    StorageLayout,
    adapters_to_remove,
    atomic_write_json,
    prune_adapters,
    read_json,
    remove_stale_temps,
    remove_tree,
)

ADAPTERS = "adapters"
LOG = f"{ADAPTERS}/active"
LOG_KEEP = 16  # pointer entries kept; a reader only ever needs the newest
TREE_RE = re.compile(r"^(policy-v\d{4,})-[A-Za-z0-9]+$")  # an uploaded version's files (unique key)
MAX_TRIES = 100


def _recent(state: dict[str, Any], name: str | None, retention: int) -> list[str]:
    """The versions activated last, `name` newest (pure)."""
    recent = [n for n in state.get("recent", []) if n != name]
    return (recent + ([name] if name else []))[-retention:]


class LocalAdapters:
    """A local storage root's `adapters/` folder (one machine)."""

    def __init__(self, adapters_dir: Path) -> None:
        self.dir = Path(adapters_dir)

    def folder(self, name: str, given: str | None) -> Path:
        """The version's folder for vLLM. ValueError: not a version name, or `given` (what a caller
        says the path is) is not that folder; LookupError: not published."""
        parse_adapter_name(name)
        path = self.dir / name
        if given is not None and Path(given).resolve() != path.resolve():
            raise ValueError(f"adapter {name!r} must be loaded from the storage root's adapters folder")
        if not (path / "adapter_config.json").is_file():
            raise LookupError(f"adapter {name!r} is not published under the storage root")
        return path

    def pointer_token(self) -> float | None:
        """Changes whenever the pointer does (cheap: polled every second)."""
        try:
            return (self.dir / "active.json").stat().st_mtime
        except FileNotFoundError:
            return None

    def read_active(self) -> dict[str, Any]:
        return read_json(self.dir / "active.json", {}) or {}

    def set_active(self, name: str | None, retention: int) -> None:
        atomic_write_json(self.dir / "active.json",
                          {"active": name, "recent": _recent(self.read_active(), name, retention)})

    def prune(self, keep: set[str], keep_newest: int) -> list[str]:
        return prune_adapters(self.dir, keep, keep_newest)


class RemoteAdapters:
    """`adapters/` on object storage, with a local cache folder for the engine (see the module doc)."""

    def __init__(self, blob_root: str, cache: Path) -> None:
        self.blobs = BlobStore(blob_root)
        self.cache = Path(cache)

    # ---- versions -----------------------------------------------------------------------------------
    def _record(self, name: str) -> dict[str, Any] | None:
        raw = self.blobs.read(f"{ADAPTERS}/{name}.json")
        return json.loads(raw) if raw is not None else None

    def versions(self) -> list[str]:
        """Published version names, oldest first."""
        names = [n[:-5] for n in self.blobs.list(ADAPTERS) if n.endswith(".json")]
        return sorted((n for n in names if ADAPTER_NAME_RE.fullmatch(n)), key=parse_adapter_name)

    def latest_version(self) -> int:
        return max((parse_adapter_name(n) for n in self.versions()), default=0)

    def publish(self, folder: Path, manifest: Callable[[int, str], dict[str, Any]]) -> tuple[str, str]:
        """Publish the adapter files in the local `folder` as the next version; returns (name, URI of
        its files). `manifest(version, name)` is written to `folder/manifest.json` for the version tried."""
        for _ in range(MAX_TRIES):
            version = self.latest_version() + 1
            name = adapter_name(version)
            meta = manifest(version, name)
            atomic_write_json(Path(folder) / "manifest.json", meta)
            key = f"{ADAPTERS}/{name}-{uuid.uuid4().hex[:12]}"
            self.blobs.put_tree(Path(folder), key)
            record = {"name": name, "version": version, "key": key, "manifest": meta,
                      "published_at": time.time()}
            if self.blobs.write_new(f"{ADAPTERS}/{name}.json", json.dumps(record, sort_keys=True).encode()):
                return name, self.blobs.uri(key)
            self.blobs.delete(key)  # another publisher won this version: ours is an orphan, try the next
        raise RuntimeError(f"could not publish a new adapter version under {self.blobs.uri(ADAPTERS)}")

    def folder(self, name: str, given: str | None) -> Path:
        """A local copy of the version for vLLM (downloaded once into the cache). ValueError: not a
        version name, or `given` is not the URI its record names; LookupError: not published."""
        parse_adapter_name(name)
        record = self._record(name)
        if record is None:
            raise LookupError(f"adapter {name!r} is not published under {self.blobs.uri(ADAPTERS)}")
        if given is not None and given != self.blobs.uri(record["key"]):
            raise ValueError(f"adapter {name!r} must be loaded from {self.blobs.uri(record['key'])}")
        dest = self.blobs.get_tree(record["key"], self.cache / record["key"].rsplit("/", 1)[-1])
        if not (dest / "adapter_config.json").is_file():
            raise LookupError(f"adapter {name!r} at {self.blobs.uri(record['key'])} has no adapter_config.json")
        return dest

    # ---- the active pointer -------------------------------------------------------------------------
    def _log(self) -> list[str]:
        return [n for n in self.blobs.list(LOG) if n.endswith(".json")]  # zero-padded: sorted = by seq

    def pointer_token(self) -> str | None:
        log = self._log()
        return log[-1] if log else None

    def read_active(self) -> dict[str, Any]:
        """The newest pointer entry ({} before the first switch)."""
        for _ in range(MAX_TRIES):
            log = self._log()
            if not log:
                return {}
            raw = self.blobs.read(f"{LOG}/{log[-1]}")
            if raw is not None:  # else trimmed between list and read (many switches since): list again
                return json.loads(raw)
        raise RuntimeError(f"cannot read the active pointer under {self.blobs.uri(LOG)}")

    def set_active(self, name: str | None, retention: int) -> None:
        for _ in range(MAX_TRIES):
            state = self.read_active()
            seq = int(state.get("seq", 0)) + 1
            entry = {"seq": seq, "active": name, "recent": _recent(state, name, retention),
                     "at": time.time(), "writer": uuid.uuid4().hex}  # unique: equal bytes mean "ours"
            if self.blobs.write_new(f"{LOG}/{seq:012d}.json", json.dumps(entry).encode()):
                for old in self._log()[:-LOG_KEEP]:
                    self.blobs.delete(f"{LOG}/{old}")
                return
        raise RuntimeError(f"could not switch the active pointer under {self.blobs.uri(LOG)}")

    # ---- retention ----------------------------------------------------------------------------------
    def prune(self, keep: set[str], keep_newest: int, grace_s: float = TMP_GRACE_S) -> list[str]:
        """Remove versions outside retention (core/storage.py `adapters_to_remove`: record first, so a
        reader never finds a record without its files), uploads no record names that are older than
        `grace_s` (a publisher that died or lost its version), and local copies of removed versions."""
        versions = self.versions()
        gone = adapters_to_remove(versions, keep, keep_newest)
        for name in gone:
            record = self._record(name)
            self.blobs.delete(f"{ADAPTERS}/{name}.json")
            if record is not None:
                self.blobs.delete(record["key"])
        kept = {r["key"].rsplit("/", 1)[-1] for n in versions if n not in gone and (r := self._record(n))}
        now = time.time()
        for entry in self.blobs.list(ADAPTERS):
            if TREE_RE.fullmatch(entry) and entry not in kept:
                mtimes = self.blobs.find(f"{ADAPTERS}/{entry}").values()
                if mtimes and now - max(mtimes) > grace_s:  # none yet: an upload that just started
                    self.blobs.delete(f"{ADAPTERS}/{entry}")
                    gone.append(entry)
        self._prune_cache(kept)
        return gone

    def _prune_cache(self, kept: set[str]) -> None:
        if not self.cache.is_dir():
            return
        remove_stale_temps(self.cache)
        for p in self.cache.iterdir():
            if TREE_RE.fullmatch(p.name) and p.name not in kept:
                remove_tree(p)


def adapter_store(layout: StorageLayout) -> LocalAdapters | RemoteAdapters:
    """The adapters of a storage layout: object storage when it has a `blob_root`, else its folder."""
    if layout.blob_root is None:
        return LocalAdapters(layout.adapters)
    return RemoteAdapters(layout.blob_root, layout.adapters)
