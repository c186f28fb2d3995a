"""`clawray start` / `status` / `stop` round trip on a local cluster of its own; config errors are one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_bad_config_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("proxy:\n  prot: 9000\n")
    r = _cli("status", "-c", str(bad), timeout=60)
    assert r.returncode == 2
    assert "proxy.prot: unknown key" in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_status_when_not_running_gives_a_hint(tmp_path):
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    cfg["storage_root"] = str(tmp_path / "state")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = _cli("status", "-c", str(path), timeout=60)
    assert r.returncode == 2 and "not running" in r.stdout and "clawray start" in r.stdout


def test_the_collective_commands_say_what_is_wrong_without_a_cluster(tmp_path):
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    cfg["storage_root"] = str(tmp_path / "state")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = _cli("skills", "-c", str(path), "evolve", timeout=60)
    assert r.returncode == 1 and "pass --now" in r.stdout + r.stderr
    r = _cli("skills", "-c", str(path), "evolve", "--now", timeout=60)
    assert r.returncode == 1 and "not running" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr
    r = _cli("skills", "-c", str(path), "promote", "x-y", "--to", "everyone", timeout=60)
    assert r.returncode == 1 and "invalid skill scope" in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.cluster  # a whole `clawray start` cluster of its own (~3 min on 2 cores): `make test-cluster`
def test_start_status_stop_round_trip(tmp_path):
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    cfg["storage_root"] = str(tmp_path / "state")
    cfg["proxy"]["port"] = _free_port()
    cfg["ray"]["head_port"] = _free_port()
    cfg["ray"]["num_cpus"] = 4
    cfg["scheduler"].update(sleep_start=None, sleep_end=None, idle_minutes=None)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    try:
        r = _cli("start", "-c", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"127.0.0.1:{cfg['proxy']['port']}" in r.stdout
        r = _cli("status", "-c", str(path), "--json", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads(r.stdout)
        assert st["proxy"]["status"] == "ok"
        assert st["omls"]["state"] == "idle_wait"
        assert st["skills"]["generation"] == 0 and st["replay"]["total"] == 0
        assert st["controller"]["mode"] == "auto" and st["controller"]["running"] is False
        # The collective job of the running system (docs/collective.md): nothing to decide yet.
        r = _cli("skills", "-c", str(path), "evolve", "--now", "--json", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["skipped_reason"] == "no new sessions since the last run"
        r = _cli("skills", "-c", str(path), "decisions", "--json", timeout=120)
        assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout + r.stderr
        r = _cli("skills", "-c", str(path), "promote", "nope", "--to", "global", timeout=120)
        assert r.returncode == 1 and "no skill named 'nope'" in r.stdout + r.stderr, r.stdout + r.stderr
    finally:
        r = _cli("stop", "-c", str(path), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "state" / "control" / "ray_head.json").exists()
    # `ray start` recorded the head as this machine's current cluster; a stale record made the README's
    # next step (`serve run`, which joins the current cluster) hang on a dead address.
    from ray._common.utils import get_ray_address_file

    current = Path(get_ray_address_file(None))
    assert not (current.exists() and current.read_text().strip().endswith(f":{cfg['ray']['head_port']}"))
    r = _cli("status", "-c", str(path), timeout=60)
    assert r.returncode == 2 and "not running" in r.stdout
