"""The engine's vLLM keeps its sockets and temp files in a private folder, not in /tmp itself.

The defect: vLLM binds its ZMQ IPC sockets as /tmp/<uuid> and its engine core's torch FileStore as
/tmp/vllm_dist_<hex>; a replica that is killed (Serve's shutdown, `ray.kill`, a crash) never removes them,
and thousands had piled up on this machine from test sessions and demos."""

from __future__ import annotations

import os
import re
import stat

from core.private_tmp import answers, temp_parent
from serve.vllm_engine import VLLM_DIR_PREFIX

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _sockets(folder):
    return [p for p in folder.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


def test_the_engines_vllm_sockets_live_in_its_private_folder(serve_app):
    parent = temp_parent()
    live = [d for d in parent.glob(VLLM_DIR_PREFIX + "*")
            if d.stat().st_uid == os.getuid() and any(answers(p) for p in _sockets(d))]
    assert live, "no private vLLM folder with a listening socket: the engine's sockets went elsewhere"
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in live)
    # Nothing vLLM-shaped in the temp folder itself from around the time this session's engine started.
    started = min(p.lstat().st_mtime for d in live for p in d.rglob("*")) - 120
    leaked = sorted(p.name for p in parent.iterdir()
                    if (UUID.fullmatch(p.name) and stat.S_ISSOCK(p.lstat().st_mode) or p.name.startswith("vllm_dist_"))
                    and p.lstat().st_mtime >= started)
    assert not leaked, f"vLLM files in {parent} itself: {leaked[:5]}"
