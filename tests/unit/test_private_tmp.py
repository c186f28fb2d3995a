"""Private temp folders of the servers clawray starts, and the sweep of those whose server is gone
(core/private_tmp.py; vLLM's in serve/vllm_engine.py)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import time
from pathlib import Path

from core.private_tmp import answers, make_private_dir, sweep_stale_dirs
from serve.vllm_engine import VLLM_DIR_PREFIX, vllm_private_dir, vllm_temp_env


def _folder(parent: Path, name: str, age_s: float, listening: bool = False) -> socket.socket:
    """A server's folder: a file and a unix socket (a dead server's: bound, never listening, as a killed
    process leaves it), everything last changed `age_s` ago."""
    d = parent / name
    d.mkdir()
    (d / "vllm_dist_0").write_text("store")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(d / "3f1c"))
    if listening:
        sock.listen(1)
    else:
        sock.close()
    old = time.time() - age_s
    for p in (d / "vllm_dist_0", d / "3f1c", d):
        os.utime(p, (old, old), follow_symlinks=False)
    return sock


def test_the_sweep_removes_only_stale_folders_of_its_kind():
    parent = make_private_dir("sw-", Path("/tmp"))  # unix socket paths are short: not under pytest's tmp
    live = _folder(parent, "cr-x-live", 3600, listening=True)
    _folder(parent, "cr-x-gone", 3600)
    _folder(parent, "cr-x-starting", 5)  # its server may not listen yet
    _folder(parent, "other-gone", 3600)
    (parent / "cr-x-link").symlink_to(parent / "cr-x-gone")
    try:
        assert answers(parent / "cr-x-live" / "3f1c") and not answers(parent / "cr-x-gone" / "3f1c")
        removed = sweep_stale_dirs(parent, "cr-x-")
        assert [p.name for p in removed] == ["cr-x-gone"]
        assert sorted(p.name for p in parent.iterdir()) == ["cr-x-link", "cr-x-live", "cr-x-starting", "other-gone"]
    finally:
        live.close()
        shutil.rmtree(parent)


def test_a_private_folder_is_only_its_users():
    d = make_private_dir("cr-test-")
    try:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.parent == Path("/tmp")
    finally:
        d.rmdir()


def test_a_vllm_engine_gets_its_own_folder_after_the_sweep(monkeypatch):
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    gone = Path("/tmp") / f"{VLLM_DIR_PREFIX}test-gone-{os.getpid()}"
    gone.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(gone / "a1b2"))
    sock.close()
    old = time.time() - 3600
    for p in (gone / "a1b2", gone):
        os.utime(p, (old, old), follow_symlinks=False)
    private = vllm_private_dir()
    try:
        assert not gone.exists(), "a folder left by a vLLM engine that is gone was not swept"
        assert private is not None and private.name.startswith(VLLM_DIR_PREFIX)
        assert vllm_temp_env(private) == {"VLLM_RPC_BASE_PATH": str(private), "TMPDIR": str(private)}
    finally:
        private.rmdir()


def test_an_operators_own_vllm_rpc_path_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    assert vllm_private_dir() is None and vllm_temp_env(None) == {}
