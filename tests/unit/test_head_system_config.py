"""`clawray start`'s head gets the same Ray system settings as the local cluster `start_ray` starts
(cluster/head.py, cluster/runtime.py `local_system_config`); the cluster itself: tests/integration/
test_ray_prestart.py."""

from __future__ import annotations

import json

import pytest

from cluster.head import start_head
from cluster.runtime import local_system_config
from core.config import REPO_ROOT, load_config


def test_the_head_clawray_starts_gets_the_same_system_settings(monkeypatch, tmp_path):
    cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env={})
    cfg = cfg.model_copy(update={"storage_root": str(tmp_path)})
    seen: list[list[str]] = []

    class Stop(Exception):
        pass

    def popen(cmd, **_kwargs):
        seen.append(cmd)
        raise Stop

    import cluster.head as head

    monkeypatch.setattr(head.subprocess, "Popen", popen)
    monkeypatch.setattr(head, "_port_open", lambda _port: False)
    with pytest.raises(Stop):
        start_head(cfg, {})
    assert f"--system-config={json.dumps(local_system_config(False))}" in seen[0]
    assert local_system_config(True) == {}
