"""The embedded default's ingress (`proxy.http_ingress: auto`): a cluster clawray starts with a loopback host
serves through Ray Serve's HAProxy, without an API key, and nothing of the serving path listens beyond
loopback: HAProxy's front end, its stats page and metrics exporter (which Ray's template binds to all
interfaces; cluster/haproxy_loopback.py moves them), the replica's own port and Serve's proxy actor.

The child starts the cluster as `clawray demo` / `clawray serve` do (cluster/runtime.py `start_ray`, then
`deploy_serving`), in upstream mode in front of an instant OpenAI-compatible upstream (no vLLM: the
ingress is what is tested), sends a chat completion through it and lists the listening TCP sockets of the
cluster's processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.haproxy_loopback import WRAPPER_NAME
from core.config import REPO_ROOT

pytestmark = pytest.mark.slow

CHILD = r"""
import asyncio, json, os, sys, threading
import httpx, psutil
from benchmarks.whole_path_servers import UPSTREAM_MODEL, _Upstream
from cluster.runtime import deploy_serving, shutdown, start_ray
from core.config import REPO_ROOT, UpstreamEndpoint, load_config
from tests.servers import free_port

up_port, port = free_port(), free_port()
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
asyncio.run_coroutine_threadsafe(loop.create_server(_Upstream, "127.0.0.1", up_port), loop).result()
for k in [k for k in os.environ if k.startswith(("CLAWRAY_", "RAY_SERVE_"))]:
    del os.environ[k]  # the embedded default: no API key, no ingress settings of the test session's
cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env={})
ep = UpstreamEndpoint(base_url=f"http://127.0.0.1:{up_port}/v1", model=UPSTREAM_MODEL)
cfg = cfg.model_copy(update={
    "storage_root": sys.argv[1],
    "engine": cfg.engine.model_copy(update={"backend": "upstream", "upstream": ep}),
    "proxy": cfg.proxy.model_copy(update={"port": port}),
    "ray": cfg.ray.model_copy(update={"num_cpus": 4}),
})
try:
    start_ray(cfg)
    base = deploy_serving(cfg, timeout_s=240)
    r = httpx.post(base + "/v1/chat/completions", timeout=60,
                   json={"model": "x", "messages": [{"role": "user", "content": "Move the dentist to 8:30."}]})
    mine = psutil.Process().children(recursive=True)
    raylet = [p for p in mine if "raylet" in p.name()]
    procs = {p.pid: p for p in mine + [q for r_ in raylet for q in r_.children(recursive=True)]}
    listening = []
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in procs:
            p = procs[c.pid]
            listening.append({"ip": c.laddr.ip, "port": c.laddr.port, "name": p.name(),
                              "cmdline": " ".join(p.cmdline())[:300]})
    print("RESULT " + json.dumps({"status": r.status_code, "reply": r.json(), "port": port, "listening": listening,
                                  "env": {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}}))
finally:
    shutdown()
"""


def _serving_listeners(listening: list[dict], env: dict[str, str]) -> dict[str, list[dict]]:
    """The serving path's HTTP listeners, by kind. Every Ray process also has its own RPC ports, on all
    interfaces behind Ray's token auth (RAY_AUTH_MODE=token, as clawray starts Ray); those are not these."""
    folder = str(Path(env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"]).parent)  # Serve's configs are under it
    lo, hi = int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]), int(env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"])
    fallback = {int(env["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"]), int(env["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"])}
    return {"haproxy": [s for s in listening if s["name"] == "haproxy" and folder in s["cmdline"]],
            "replica": [s for s in listening if "ServeReplica" in s["cmdline"] and lo <= s["port"] <= hi],
            "fallback proxy": [s for s in listening if "ProxyActor" in s["cmdline"] and s["port"] in fallback]}


def test_the_embedded_default_serves_through_haproxy_and_listens_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAWRAY_", "RAY_SERVE_", "RAY_ADDRESS"))}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=420, env={**env, "PYTHONPATH": str(REPO_ROOT)})
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["status"] == 200 and got["reply"]["choices"][0]["message"]["content"]
    assert got["env"].get("RAY_SERVE_ENABLE_HA_PROXY") == "1"  # auto chose HAProxy
    assert Path(got["env"]["RAY_SERVE_HAPROXY_BINARY_PATH"]).name == WRAPPER_NAME
    serving = _serving_listeners(got["listening"], got["env"])
    everything = json.dumps(got["listening"], indent=1)
    assert [s["ip"] for s in serving["haproxy"] if s["port"] == got["port"]] == ["127.0.0.1"], everything
    assert len(serving["haproxy"]) == 3, everything  # the front end, the stats page, the metrics exporter
    assert serving["replica"] and serving["fallback proxy"], everything
    beyond = [s for group in serving.values() for s in group if s["ip"] != "127.0.0.1"]
    assert beyond == [], everything
