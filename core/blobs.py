"""Blobs under one storage root: a local folder or object storage (`s3://bucket/prefix`, `gs://...`).

`BlobStore` is the small surface the planes need over fsspec (s3fs, gcsfs, the local file system): put a
file or a folder under a key, fetch a folder into a local folder (vLLM and peft read local paths), list,
delete, and one conditional write, `write_new` (create-only). Objects cannot be renamed, so publishing is
"write under a unique key, then make it visible by a create-only write of a small record": the object
store answers a second create of the same key with 412, so exactly one writer wins (core/adapter_store.py
builds the adapter versions and the active pointer on it).

Why create-only and not If-Match (compare-and-swap on an ETag): S3 has both, but gcsfs exposes only
create-only (`ifGenerationMatch=0`, fsspec's `mode="create"`), and a log of create-only entries is a
compare-and-swap on every backend (the writer that read entry n is the only one who can create n + 1). On
a local folder the same write is a temp file linked into place (`os.link` refuses an existing name) and
fsynced, keeping today's durable-rename semantics.

Endpoint and credentials come only from the standard places, never from YAML: botocore's env
(`AWS_ENDPOINT_URL_S3` for an S3-compatible server such as MinIO, `AWS_ACCESS_KEY_ID`/`AWS_PROFILE`, or
the instance role), Google's application-default credentials for `gs://`.
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from core.config import ConfigError
from core.storage import TMP_PREFIX, durable_temp, fsync_dir, remote_scheme, rename_durably

FS_PROTOCOL = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}  # storage_root scheme -> fsspec protocol
# Where botocore finds an S3-compatible endpoint. Not secrets: a driver may hand them to the processes it
# starts on other nodes (Ray Train workers); credentials stay with each node's env or instance role.
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
PACKAGE = {"s3": "s3fs", "gcs": "gcsfs"}


def remote_filesystem(scheme: str) -> Any:
    """The fsspec file system for a remote root's scheme; a clear error when its package is missing."""
    protocol = FS_PROTOCOL[scheme]
    try:
        __import__(PACKAGE[protocol])
    except ImportError:
        raise ConfigError(f"storage_root {scheme}://... needs the {PACKAGE[protocol]} package: "
                          f"pip install {PACKAGE[protocol]}") from None
    import fsspec

    # The endpoint botocore would read from this process's env, pinned into the instance: Ray pickles
    # the checkpoint filesystem into processes that may lack the env (its Train controller).
    pinned = {"endpoint_url": ep} if protocol == "s3" and (ep := _s3_endpoint()) else {}
    # No listings cache: a version record or pointer entry written by another host must be seen at once.
    return fsspec.filesystem(protocol, use_listings_cache=False, skip_instance_cache=True, **pinned)


def _s3_endpoint() -> str | None:
    return next((os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)), None)


def _mtime(info: dict[str, Any]) -> float:
    value = info.get("LastModified") or info.get("updated") or info.get("mtime") or 0.0
    return value.timestamp() if isinstance(value, datetime) else float(value)


class BlobStore:
    """Keys are `/`-separated paths relative to the root (`adapters/policy-v0007.json`)."""

    def __init__(self, root: str | Path) -> None:
        root = str(root)
        scheme = remote_scheme(root)
        self.remote = scheme is not None
        if self.remote:
            self.root = root.rstrip("/")
            self.fs = remote_filesystem(scheme)
            self._base = self.root.split("://", 1)[1]
        else:
            from fsspec.implementations.local import LocalFileSystem

            self.root = self._base = str(Path(root).resolve())
            self.fs = LocalFileSystem(auto_mkdir=True)

    def path(self, key: str) -> str:
        """The file system path of `key` (no scheme: what `self.fs` takes)."""
        return f"{self._base}/{key.strip('/')}" if key.strip("/") else self._base

    def uri(self, key: str) -> str:
        return f"{self.root}/{key.strip('/')}"

    # ---- writes -------------------------------------------------------------------------------------
    def put_file(self, src: Path, key: str) -> None:
        if self.remote:
            self.fs.put_file(str(src), self.path(key))
            return
        dst = Path(self.path(key))
        tmp = self._local_copy(src, dst)
        rename_durably(tmp, dst)

    def put_tree(self, src: Path, prefix: str) -> None:
        """Every file under the local folder `src`, at `prefix/<relative path>`. Not atomic on object
        storage: write under a key nobody reads yet and publish it with `write_new`."""
        files = sorted(p for p in Path(src).rglob("*") if p.is_file())
        if self.remote:
            self.fs.put([str(p) for p in files], [self.path(f"{prefix}/{p.relative_to(src).as_posix()}")
                                                  for p in files])
            return
        dst = Path(self.path(prefix))
        tmp = self._local_copy(Path(src), dst)
        rename_durably(tmp, dst)  # a non-empty `dst` is refused: a key is written once

    def _local_copy(self, src: Path, dst: Path) -> Path:
        """A durable copy of `src` in a temp entry beside `dst` (file or folder), ready to be renamed."""
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        if src.is_dir():
            shutil.copytree(src, tmp)
        else:
            shutil.copyfile(src, tmp)
        for p in [tmp, *tmp.rglob("*")] if tmp.is_dir() else [tmp]:
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            else:
                fsync_dir(p)
        return tmp

    def write_new(self, key: str, data: bytes) -> bool:
        """Create `key` holding `data` unless it exists (create-only, atomic). True when `key` now holds
        exactly `data`: this writer won, or its own earlier attempt landed (a retried PUT whose first
        response was lost); False when another writer's object is there."""
        try:
            if self.remote:
                self.fs.pipe_file(self.path(key), data, mode="create")  # 412 -> FileExistsError
            else:
                self._link_new(Path(self.path(key)), data)
            return True
        except FileExistsError:
            return self.read(key) == data

    def _link_new(self, dst: Path, data: bytes) -> None:
        tmp = durable_temp(dst.parent, data)
        try:
            os.link(tmp, dst)  # atomic, and refuses an existing name (rename would replace it)
            fsync_dir(dst.parent)
        finally:
            tmp.unlink()

    def delete(self, key: str) -> None:
        """Remove a file or everything under a prefix; a missing key is not an error."""
        try:
            self.fs.rm(self.path(key), recursive=True)
        except FileNotFoundError:
            pass

    # ---- reads --------------------------------------------------------------------------------------
    def read(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self.path(key))
        except (FileNotFoundError, IsADirectoryError):
            return None

    def list(self, prefix: str) -> list[str]:
        """Names directly under `prefix` (files and sub-prefixes), without temp entries."""
        try:
            entries = self.fs.ls(self.path(prefix), detail=False)
        except FileNotFoundError:
            return []
        names = (e.rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return sorted(n for n in names if n and not n.startswith(TMP_PREFIX))

    def find(self, prefix: str) -> dict[str, float]:
        """{path relative to `prefix`: modification time} of every file under `prefix`."""
        base = self.path(prefix).rstrip("/") + "/"
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(base):]: _mtime(info) for p, info in found.items()
                if p.startswith(base) and info.get("type") != "directory"}

    def get_tree(self, prefix: str, dest: Path) -> Path:
        """Download everything under `prefix` into the local folder `dest`, which appears whole (temp
        folder, then rename) or not at all. An existing `dest` is kept (keys are written once)."""
        dest = Path(dest)
        if dest.is_dir():
            return dest
        files = sorted(self.find(prefix))
        if not files:
            raise FileNotFoundError(f"nothing under {self.uri(prefix)}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            for rel in files:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            self.fs.get([self.path(f"{prefix}/{rel}") for rel in files], [str(tmp / rel) for rel in files])
            try:
                rename_durably(tmp, dest)
            except OSError:
                if not dest.is_dir():  # not "someone else filled it first"
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest


def endpoint_env() -> dict[str, str]:
    """This process's S3 endpoint settings (`ENDPOINT_ENV`), to pass on to processes it starts."""
    return {k: os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)}


def checkpoint_storage(layout) -> tuple[str, Any]:
    """(storage_path, storage_filesystem) for Ray Train's `RunConfig`: the local checkpoints folder and
    None, or for an object-storage root the prefix-stripped path `<bucket>/<prefix>/checkpoints` on a
    pyarrow file system wrapping the same fsspec client as the blobs (pyarrow's own S3 client does not
    read `AWS_ENDPOINT_URL_S3`; this one does, through botocore)."""
    if layout.blob_root is None:
        return str(layout.checkpoints), None
    import pyarrow.fs

    store = BlobStore(layout.blob_root)
    return store.path("checkpoints"), pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(store.fs))
