"""Starting and stopping the local runtime: Ray (local or joined), Serve, the clawray app."""

from __future__ import annotations

import os
import time

from cluster.serve_app import build_app
from core import names
from core.config import REPO_ROOT, ClawrayConfig


def runtime_env_vars(cfg: ClawrayConfig) -> dict[str, str]:
    return {
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_TRAIN_V2_ENABLED": "1",
        "VLLM_CACHE_ROOT": str(cfg.cache_path() / "vllm"),
        # The head listens beyond loopback: Ray's token auth (token in ~/.ray/auth_token) on both the
        # head and every client that connects to it.
        "RAY_AUTH_MODE": "token",
    }


def local_custom_resources(cfg: ClawrayConfig) -> dict[str, float]:
    """The custom resources a one-machine cluster of our own offers: what the engine replicas
    (`engine.resources`) and the most training workers (`train.worker_resources`) ask for together, so a
    profile written for a cluster's node types (configs/gpu.yaml) also schedules on one machine."""
    out: dict[str, float] = {}
    for asks, times in ((cfg.engine.resources, cfg.engine.num_replicas),
                        (cfg.train.worker_resources, cfg.train.max_workers())):
        for name, amount in asks.items():
            out[name] = out.get(name, 0.0) + amount * times
    return out


def local_system_config(prestart_workers: bool) -> dict[str, bool]:
    """Ray's system settings for a cluster clawray starts itself (`ray.init` below, `ray start` in
    cluster/head.py; `ray.prestart_workers`): without prestarting, no idle workers are started ahead,
    neither for the first driver nor when tasks queue."""
    return {} if prestart_workers else {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


def start_ray(cfg: ClawrayConfig):
    """Join `ray.address` or start a local cluster; this driver's namespace is `ray.namespace`."""
    import ray

    from cluster.serve_app import ingress_env

    for k, v in runtime_env_vars(cfg).items():
        os.environ.setdefault(k, v)  # inherited by local workers; RAY_TRAIN_V2 must precede imports
    if not ray.is_initialized() and cfg.ray.address is None:
        # The cluster we start: Serve reads its ingress settings at start. They win over what the env has
        # (a stale folder of an earlier start; an operator's HAProxy binary is wrapped, not bypassed), except
        # the tunables that ingress_env leaves to the operator.
        os.environ.update(ingress_env(cfg))
    if not ray.is_initialized():
        ray.init(
            # "local": always a new cluster of our own, never an unrelated `ray start` on this machine.
            address=cfg.ray.address or "local",
            num_cpus=cfg.ray.num_cpus if cfg.ray.address is None else None,
            resources=local_custom_resources(cfg) if cfg.ray.address is None else None,
            namespace=cfg.ray.namespace,
            include_dashboard=cfg.ray.include_dashboard,
            _system_config=local_system_config(cfg.ray.prestart_workers) if cfg.ray.address is None else None,
            log_to_driver=False,
            configure_logging=False,
        )
    return ray


def deploy_serving(cfg: ClawrayConfig, sink_actors: list[str] | None = None, timeout_s: float = 300):
    """Start Serve on the configured host/port and deploy the app; returns the base URL when healthy."""
    import httpx
    from ray import serve

    serve.start(http_options={"host": cfg.proxy.host, "port": cfg.proxy.port},
                proxy_location="HeadOnly" if cfg.proxy.ingress == "head_only" else "EveryNode")
    serve.run(build_app(cfg, sink_actors=sink_actors), name=names.APP, route_prefix="/",
              blocking=False)
    host = "127.0.0.1" if cfg.proxy.host in ("0.0.0.0", "::") else cfg.proxy.host
    base = f"http://{host}:{cfg.proxy.port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=5).status_code == 200:
                return base
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"clawray did not become healthy at {base} within {timeout_s:.0f}s")


def shutdown() -> None:
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
