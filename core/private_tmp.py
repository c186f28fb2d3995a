"""Private temp folders for the servers clawray starts (HAProxy's sockets, vLLM's IPC sockets), and the
sweep that removes the folders of servers that are gone.

A server killed without its shutdown (a Ray actor is killed, a replica crashes, the host reboots a
process) leaves its unix sockets and files behind, and nothing else ever removes them: vLLM puts its ZMQ
IPC sockets (`/tmp/<uuid>`) and its torch FileStore (`/tmp/vllm_dist_<hex>`) straight into the shared temp
folder, several per engine start. Each server instead gets a folder of its own (`make_private_dir`, mode
0700), and each start sweeps the earlier folders of its kind that are stale (`sweep_stale_dirs`).

Why hand-written: the liveness test is specific (a live server answers on one of its unix sockets), and
a folder that is merely old must be kept while its server runs (days, on a workstation).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STALE_DIR_S = 300.0  # a folder nothing changed in for this long, whose sockets do not answer, is stale


def temp_parent() -> Path:
    """The host's temp folder for sockets: /tmp when it exists (short paths: a unix socket's path has
    ~100 bytes), else Python's temp dir."""
    return Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())


def make_private_dir(prefix: str, parent: Path | None = None) -> Path:
    """A new folder only this user can enter (0700), under `parent` (default `temp_parent()`)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or temp_parent()))
    path.chmod(0o700)
    return path


def answers(sock: Path) -> bool:
    """Whether a server listens on the unix stream socket `sock` (connect only: nothing is sent)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def sweep_stale_dirs(parent: Path, prefix: str, min_age_s: float = STALE_DIR_S,
                     is_socket: Callable[[Path], bool] | None = None) -> list[Path]:
    """Remove the folders `parent/<prefix>*` that are this user's, in which nothing changed for `min_age_s`
    (a server being set up right now may not listen yet) and where no unix socket answers (`is_socket`
    picks the sockets to try; default: every socket file in the folder). Returns the folders removed."""
    removed = []
    for d in parent.glob(prefix + "*"):
        try:
            if not d.is_dir() or d.is_symlink() or d.stat().st_uid != os.getuid():
                continue
            inside = list(d.rglob("*"))
            newest = max([d.stat().st_mtime, *(p.lstat().st_mtime for p in inside)])
            if time.time() - newest < min_age_s:
                continue
            sockets = [p for p in inside if stat.S_ISSOCK(p.lstat().st_mode) and (is_socket is None or is_socket(p))]
            if any(answers(p) for p in sockets):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed
