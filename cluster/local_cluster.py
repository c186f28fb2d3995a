"""A multi-node Ray cluster with a real autoscaler on this machine (cluster/cluster-local.yaml).

    python -m cluster.local_cluster up [--port 6379] [--temp-dir DIR]   # prints the address to join
    python -m cluster.local_cluster down [--temp-dir DIR]

`up` runs `RAY_FAKE_CLUSTER=1 ray start --head --block --autoscaling-config=...` in a process session of
its own, with the head's CPUs and custom resources taken from the config's head node type; Ray's fake
multi-node provider then starts the serving node (`min_workers: 1`) and adds or removes training nodes
as the autoscaler decides (each "node" a raylet of its own on this machine). `ray up` cannot start this
provider in Ray 2.60 (the wheel lacks the defaults file it merges in), and
`ray.cluster_utils.AutoscalingCluster` runs `ray stop --force`, which ends every Ray cluster on the
machine. `down` ends exactly the processes of that session (the head, the autoscaler and every node it
started), never other Ray clusters.

The fake nodes connect to the head's GCS at `provider.gcs_address`, by default this machine's IP and port
6379; `up` writes a copy of the config with the chosen port (and `idle_timeout_minutes`, when given) into
its temp dir. Nodes run the same Python and working tree as the head: its env (PYTHONPATH, Ray's token
auth, clawray's runtime vars: cluster/runtime.py) is theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cluster.head import pid_alive
from core.config import REPO_ROOT, load_config

CONFIG = REPO_ROOT / "cluster" / "cluster-local.yaml"
DEFAULT_TEMP_DIR = Path("/tmp/clawray-local-cluster")  # short: Ray's socket paths live under it
INFO_FILE = "cluster.json"


def autoscaling_config(config: dict[str, Any], gcs_address: str,
                       idle_timeout_minutes: float | None = None) -> dict[str, Any]:
    """The config the autoscaler reads: `config` with the GCS address the fake nodes must join."""
    out = json.loads(json.dumps(config))
    out["provider"]["gcs_address"] = gcs_address
    if idle_timeout_minutes is not None:
        out["idle_timeout_minutes"] = idle_timeout_minutes
    return out


def head_start_args(config: dict[str, Any]) -> list[str]:
    """`ray start` flags for the head: its node type's CPUs and custom resources (the fake provider does
    not start the head, so the config's numbers only hold if `ray start` is told them)."""
    res = dict(config["available_node_types"][config["head_node_type"]]["resources"])
    args = [f"--num-cpus={int(res.pop('CPU', 0))}", f"--num-gpus={int(res.pop('GPU', 0))}"]
    return args + ([f"--resources={json.dumps(res)}"] if res else [])


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def up(temp_dir: Path = DEFAULT_TEMP_DIR, *, port: int = 6379, config_path: Path = CONFIG,
       env: dict[str, str] | None = None, idle_timeout_minutes: float | None = None,
       update_interval_s: int = 5, dashboard: bool = False, timeout_s: float = 90) -> dict[str, Any]:
    """Start the head (and with it the autoscaler); returns {pid, address, temp_dir}, also written to
    `<temp_dir>/cluster.json` for `down`."""
    from ray._private.services import get_node_ip_address

    ip = get_node_ip_address()
    if _port_open(ip, port) or _port_open("127.0.0.1", port):
        raise RuntimeError(f"port {port} is taken (another Ray cluster?): choose another with --port")
    temp_dir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(config_path.read_text())
    auto = temp_dir / "autoscaling.json"
    auto.write_text(json.dumps(autoscaling_config(config, f"{ip}:{port}", idle_timeout_minutes)))
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
           f"--autoscaling-config={auto}", f"--temp-dir={temp_dir / 'ray'}", "--disable-usage-stats",
           f"--include-dashboard={str(dashboard).lower()}", *head_start_args(config)]
    full_env = {**os.environ, **(env or {}), "RAY_FAKE_CLUSTER": "1",
                "AUTOSCALER_UPDATE_INTERVAL_S": str(update_interval_s)}
    log = temp_dir / "head.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO_ROOT,
                                start_new_session=True)  # its own process group: `down` ends all of it
    info = {"pid": proc.pid, "address": f"{ip}:{port}", "temp_dir": str(temp_dir)}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray head exited with code {proc.returncode}; see {log}")
        if _port_open(ip, port):
            (temp_dir / INFO_FILE).write_text(json.dumps(info))
            return info
        time.sleep(0.5)
    down_pid(proc.pid)
    raise TimeoutError(f"ray head did not listen on {ip}:{port} within {timeout_s:.0f} s; see {log}")


def _group_pids(pgid: int) -> list[int]:
    out = subprocess.run(["pgrep", "--pgroup", str(pgid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def down_pid(pid: int, timeout_s: float = 60) -> None:
    """End the process group `up` started (SIGTERM: Ray's head tears its nodes down; then SIGKILL what is
    left of that group, e.g. a fake node's raylet the autoscaler had started)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _group_pids(pid):
        time.sleep(0.5)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def down(temp_dir: Path = DEFAULT_TEMP_DIR) -> bool:
    """Stop the cluster `up` started under `temp_dir`; False when none runs there."""
    path = temp_dir / INFO_FILE
    if not path.exists():
        return False
    info = json.loads(path.read_text())
    running = pid_alive(info["pid"]) or bool(_group_pids(info["pid"]))
    down_pid(info["pid"])
    path.unlink()
    return running


def main(argv: list[str] | None = None) -> int:
    from cluster.runtime import runtime_env_vars

    p = argparse.ArgumentParser(prog="python -m cluster.local_cluster", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--temp-dir", type=Path, default=DEFAULT_TEMP_DIR)
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--config", type=Path, default=CONFIG, help="autoscaler config (default %(default)s)")
    p.add_argument("--no-dashboard", action="store_true", help="no Ray dashboard (saves memory and CPU)")
    args = p.parse_args(argv)
    if args.action == "down":
        print("stopped" if down(args.temp_dir) else f"no local cluster runs under {args.temp_dir}")
        return 0
    env = {"PYTHONPATH": str(REPO_ROOT), **runtime_env_vars(load_config())}
    info = up(args.temp_dir, port=args.port, config_path=args.config, env=env, dashboard=not args.no_dashboard)
    print(f"Ray head at {info['address']} (autoscaler: {args.config}); join it with "
          f"CLAWRAY__RAY__ADDRESS={info['address']}; stop it with `python -m cluster.local_cluster down`")
    if not args.no_dashboard:
        print("Ray dashboard: http://127.0.0.1:8265 (`ray status --address ...` shows nodes and pending demand)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
