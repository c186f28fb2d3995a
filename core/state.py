"""Which database a store opens (config `state:`), and the refusal of unsafe embedded setups.

`state.dsn` unset = the embedded default: one SQLite file per store under the storage root. SQLite's WAL
mode needs one host's shared memory and POSIX locks: on a network file system (NFS, EFS, Filestore, SMB,
FUSE mounts) or shared by several hosts it can lose or corrupt committed data. So an embedded store
refuses to open there, and refuses a storage root that another host has opened, with a message naming
the fix (`state.dsn: postgresql://...`, docs/cluster.md).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from core.config import ConfigError, StateConfig
from core.db import Database, PostgresDatabase, SqliteDatabase

HOST_FILE = ".sqlite-host"  # under the storage root: the host whose processes use its SQLite files
# File systems on which SQLite WAL is unsafe (fs type in /proc/mounts). FUSE covers s3fs, gcsfuse, sshfs.
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre", "gpfs",
              "beegfs", "ocfs2", "gfs2", "fuse", "efs")
FIX = ("set `state.dsn: postgresql://...` (managed PostgreSQL such as RDS or Cloud SQL; docs/cluster.md) "
       "or keep the storage root on a local disk of a single host")


def mount_fs_type(path: Path, mounts: str | None = None) -> str:
    """The file-system type of the mount holding `path` (the longest mount point that prefixes it)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return "unknown"
    p = str(Path(path).resolve())
    best, fstype = "", "unknown"
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (p == point or p.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


def is_network_fs(fstype: str) -> bool:
    base = fstype.split(".")[0].lower()
    return base in NETWORK_FS or fstype.lower() in NETWORK_FS


def check_embedded(root: Path, host: str | None = None, mounts: str | None = None) -> None:
    """Refuse SQLite state under `root` on a network file system or opened from another host."""
    root.mkdir(parents=True, exist_ok=True)
    fstype = mount_fs_type(root, mounts)
    if is_network_fs(fstype):
        raise ConfigError(
            f"storage root {root} is on a network file system ({fstype}): SQLite state there can be lost or "
            f"corrupted (WAL needs one host's shared memory and locks); {FIX}")
    host = host or socket.gethostname()
    marker = root / HOST_FILE
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        owner = marker.read_text(encoding="utf-8").strip()
        if owner and owner != host:
            raise ConfigError(
                f"the SQLite state under {root} belongs to host {owner!r}, and this is {host!r}: SQLite state "
                f"cannot be shared by several hosts; {FIX}. If the folder was moved here on purpose (a "
                f"restore), delete {marker} first.") from None
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(host + "\n")


def open_database(cfg: StateConfig | None, sqlite_path: Path, store: str, *,
                  synchronous: str = "NORMAL", storage_root: Path | None = None) -> Database:
    """The database of one store: PostgreSQL (schema `<namespace>_<store>`) when `cfg.dsn` is set, else
    the SQLite file `sqlite_path` (checked by `check_embedded` against `storage_root` when given)."""
    if cfg is not None and cfg.dsn:
        return PostgresDatabase(cfg.connection_string(), f"{cfg.namespace}_{store}", max_size=cfg.pool_size)
    if storage_root is not None:
        check_embedded(storage_root)
    return SqliteDatabase(sqlite_path, synchronous=synchronous)
