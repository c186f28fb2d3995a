"""A local Ray head that outlives the CLI process (`clawray start` … `clawray stop`).

`ray start --head --block` runs in its own process session; it owns the cluster's processes and tears
them down when it gets SIGTERM, so `clawray stop` ends exactly the cluster it started — never other Ray
clusters on the machine (what a plain `ray stop` would do).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.config import ClawrayConfig
from core.storage import StorageLayout, atomic_write_json, read_json


def _pointer(cfg: ClawrayConfig) -> Path:
    return StorageLayout(cfg.storage_path()).control / "ray_head.json"


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def running_head(cfg: ClawrayConfig) -> dict | None:
    info = read_json(_pointer(cfg), None)
    if info and pid_alive(info["pid"]) and _port_open(info["port"]):
        return info
    return None


def cluster_address(cfg: ClawrayConfig) -> str | None:
    """Where a CLI command should connect: the configured address, or the head we started."""
    if cfg.ray.address:
        return cfg.ray.address
    info = running_head(cfg)
    return f"127.0.0.1:{info['port']}" if info else None


def start_head(cfg: ClawrayConfig, env: dict[str, str], timeout_s: float = 90) -> dict:
    info = running_head(cfg)
    if info:
        return info
    port = cfg.ray.head_port
    if _port_open(port):
        raise RuntimeError(f"port {port} is taken (another Ray cluster?): set ray.head_port or ray.address")
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "ray"), "start", "--head", "--block", f"--port={port}",
           "--disable-usage-stats", f"--include-dashboard={str(cfg.ray.include_dashboard).lower()}"]
    if cfg.ray.num_cpus:
        cmd.append(f"--num-cpus={cfg.ray.num_cpus}")
    from cluster.runtime import local_custom_resources, local_system_config

    if resources := local_custom_resources(cfg):  # the one node must offer what engine and trainer ask for
        cmd.append(f"--resources={json.dumps(resources)}")
    if system := local_system_config(cfg.ray.prestart_workers):
        cmd.append(f"--system-config={json.dumps(system)}")
    log = _pointer(cfg).with_name("ray_head.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray head exited with code {proc.returncode}; see {log}")
        if _port_open(port):
            info = {"pid": proc.pid, "port": port, "started_at": time.time()}
            atomic_write_json(_pointer(cfg), info)
            return info
        time.sleep(0.5)
    proc.terminate()
    raise TimeoutError(f"ray head did not listen on port {port} within {timeout_s:.0f}s; see {log}")


def stop_head(cfg: ClawrayConfig, timeout_s: float = 60) -> bool:
    info = read_json(_pointer(cfg), None)
    if not info or not pid_alive(info["pid"]):
        _pointer(cfg).unlink(missing_ok=True)
        return False
    os.killpg(info["pid"], signal.SIGTERM)
    deadline = time.time() + timeout_s
    while time.time() < deadline and pid_alive(info["pid"]):
        time.sleep(0.3)
    if pid_alive(info["pid"]):
        os.killpg(info["pid"], signal.SIGKILL)
    _pointer(cfg).unlink(missing_ok=True)
    forget_current_cluster(info["port"])
    return True


def forget_current_cluster(port: int) -> bool:
    """Remove Ray's "current cluster" record (`/tmp/ray/ray_current_cluster`, written by `ray start`)
    when it names the head we just stopped: `serve run` and `ray.init()` join the current cluster, and a
    stale record makes them hang on a dead address. A record of another cluster is left alone (that is
    what `ray stop` would not do: it resets the record whatever it names)."""
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    try:
        named = path.read_text().strip()
    except OSError:
        return False
    if not named.endswith(f":{port}"):
        return False
    path.unlink(missing_ok=True)
    return True
