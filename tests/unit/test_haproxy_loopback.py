"""cluster/haproxy_loopback.py: Serve's HAProxy with its stats page and metrics exporter on loopback.

The config is the one Ray's own HAProxy manager generates (so a Ray upgrade that moves these listeners
fails here), and the rewritten config is checked by the real HAProxy binary (`-c`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.haproxy_loopback import is_strict_wrapper, rewrite, split_address, write_wrapper

STATS, METRICS, FRONT = 18404, 19101, 18000


def _ray_config(tmp_path: Path, host: str = "127.0.0.1") -> Path:
    """The HAProxy config Ray Serve 2.60 writes for an app with no replicas yet."""
    from ray.serve._private.haproxy import HAProxyApi, HAProxyConfig
    from ray.serve.config import HTTPOptions

    cfg = HAProxyConfig(socket_path=str(tmp_path / "admin.sock"), server_state_base=str(tmp_path),
                        server_state_file=str(tmp_path / "server-state"), stats_port=STATS, metrics_port=METRICS,
                        http_options=HTTPOptions(host=host, port=FRONT))
    api = HAProxyApi(cfg, config_file_path=str(tmp_path / "haproxy.cfg"))
    asyncio.run(asyncio.to_thread(api._generate_config_file_internal))
    return tmp_path / "haproxy.cfg"


def _binds(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.strip().startswith("bind ")]


def test_rays_config_opens_stats_and_metrics_on_all_interfaces_and_the_rewrite_moves_them(tmp_path):
    text = _ray_config(tmp_path).read_text()
    assert set(_binds(text)) == {f"*:{STATS}", f":{METRICS}", f"127.0.0.1:{FRONT}"}  # Ray 2.60's template
    _, beyond = rewrite(text, set())
    assert len(beyond) == 2  # what a strict wrapper refuses without the ports to move
    fixed, beyond = rewrite(text, {STATS, METRICS})
    assert beyond == []
    assert set(_binds(fixed)) == {f"127.0.0.1:{STATS}", f"127.0.0.1:{METRICS}", f"127.0.0.1:{FRONT}"}
    assert fixed.replace(f"127.0.0.1:{STATS}", f"*:{STATS}").replace(f"127.0.0.1:{METRICS}", f":{METRICS}") == text


def test_the_rewritten_config_is_valid_for_the_real_haproxy(tmp_path):
    from cluster.serve_app import haproxy_binary

    path = _ray_config(tmp_path)
    path.write_text(rewrite(path.read_text(), {STATS, METRICS})[0])
    out = subprocess.run([haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_front_end_beyond_loopback_stays_and_is_named():
    text = f"frontend f\n    bind 0.0.0.0:{FRONT}\nlisten stats\n  bind *:{STATS}\n  bind /run/x.sock\n"
    fixed, beyond = rewrite(text, {STATS})
    assert beyond == [f"bind 0.0.0.0:{FRONT}"]
    assert f"  bind 127.0.0.1:{STATS}\n" in fixed and "bind /run/x.sock" in fixed


@pytest.mark.parametrize(("addr", "host"), [("*:80", "*"), (":80", ""), ("127.0.0.1:80", "127.0.0.1"),
                                            ("[::1]:80", "[::1]"), ("ipv4@0.0.0.0:80", "0.0.0.0"),
                                            ("/run/h.sock", None), ("unix@/run/h.sock", None)])
def test_bind_addresses_are_split_like_haproxy_reads_them(addr, host):
    assert split_address(addr)[0] == host


def _fake_haproxy(tmp_path: Path) -> Path:
    """Stands in for HAProxy: prints its pid, its arguments and the config it was given."""
    fake = tmp_path / "fake-haproxy"
    fake.write_text('#!/bin/sh\necho "pid=$$"\necho "args=$*"\nwhile [ "$1" != "-f" ]; do shift; done\ncat "$2"\n')
    fake.chmod(0o755)
    return fake


def test_the_wrapper_rewrites_the_config_in_place_and_becomes_haproxy_with_its_arguments(tmp_path):
    cfg = _ray_config(tmp_path)
    wrapper = write_wrapper(tmp_path, str(_fake_haproxy(tmp_path)), [STATS, METRICS], strict=True)
    assert os.access(wrapper, os.X_OK) and (wrapper.stat().st_mode & 0o077) == 0
    proc = subprocess.Popen([str(wrapper), "-db", "-f", str(cfg), "-sf", "123"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    # The same process (Serve signals HAProxy by this pid) with Serve's arguments (it finds its HAProxy
    # processes by the config path in their command line).
    assert f"pid={proc.pid}\n" in out and f"args=-db -f {cfg} -sf 123\n" in out
    assert set(_binds(out)) == {f"127.0.0.1:{STATS}", f"127.0.0.1:{METRICS}", f"127.0.0.1:{FRONT}"}
    assert _binds(cfg.read_text()) == _binds(out)  # rewritten in place
    assert is_strict_wrapper(str(wrapper))


def test_a_strict_wrapper_refuses_a_listener_beyond_loopback_and_starts_nothing(tmp_path):
    cfg = _ray_config(tmp_path, host="0.0.0.0")
    before = cfg.read_text()
    wrapper = write_wrapper(tmp_path, str(_fake_haproxy(tmp_path)), [STATS, METRICS], strict=True)
    out = subprocess.run([str(wrapper), "-db", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "pid=" not in out.stdout
    assert f"bind *:{FRONT}" in out.stderr and "beyond loopback" in out.stderr  # Ray writes 0.0.0.0 as *
    assert cfg.read_text() == before
    # Not strict (a proxy host beyond loopback, which needs an API key): the front end stays where it was.
    lax = write_wrapper(tmp_path, str(_fake_haproxy(tmp_path)), [STATS, METRICS], strict=False)
    out = subprocess.run([str(lax), "-db", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"bind *:{FRONT}" in out.stdout and f"bind 127.0.0.1:{STATS}" in out.stdout
    assert not is_strict_wrapper(str(lax)) and not is_strict_wrapper(sys.executable)


@pytest.mark.parametrize("seed", range(8))
def test_the_replicas_port_ranges_lie_below_the_kernels_ephemeral_ports(tmp_path, seed, monkeypatch):
    """Ray's own processes listen on ports the kernel picks from its ephemeral range (on all interfaces,
    behind Ray's token auth); a replica port range chosen inside it can meet one of them, and then Serve's
    direct-ingress bind of that port fails or an RPC port passes for a replica's HTTP listener."""
    import random

    from cluster import serve_app

    monkeypatch.setattr(serve_app, "_ephemeral_start", lambda: 32768)  # Linux's default
    monkeypatch.setattr(random, "randrange", random.Random(seed).randrange)
    env = serve_app.haproxy_env(tmp_path / "ha")
    lo = int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"])
    hi = int(env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"])
    assert 20000 <= lo and lo + 199 == hi < 32768  # above Ray's default worker ports (10002-19999)


SINGLE_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")


@pytest.mark.parametrize("seed", range(4))
def test_haproxys_and_the_fallback_proxys_ports_are_not_ones_the_kernel_hands_out_meanwhile(tmp_path, seed, monkeypatch):
    """HAProxy binds its stats and metrics ports, Serve its fallback proxy's, only once Ray and Serve have
    started: seconds and hundreds of sockets later. A port taken from the kernel's ephemeral range (bind to
    port 0, then close) can be handed to any of those sockets meanwhile. Seen in a 30-run `clawray bench`
    (2026-12-07): "cannot bind socket (Address already in use) for [127.0.0.1:44747]", HAProxy crashed at
    startup and the run failed. The ports lie below that range, beside the replicas' ranges, and are free."""
    import random
    import socket

    from cluster import serve_app

    first = serve_app._ephemeral_start()  # this machine's kernel's
    block = serve_app.REPLICA_PORTS + serve_app.SINGLE_PORTS
    monkeypatch.setattr(random, "randrange", random.Random(seed).randrange)
    env = serve_app.haproxy_env(tmp_path / "ha")
    singles = [int(env[k]) for k in SINGLE_PORTS]
    replicas = range(int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]), int(env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"]) + 1)
    assert len(set(singles)) == 4 and not set(singles) & set(replicas)
    if first - block > 20000:  # room below the range
        assert all(20000 <= p < first for p in singles), (singles, first)
    for p in singles:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when chosen


def test_a_block_whose_port_is_taken_is_passed_over(monkeypatch):
    import random
    import socket

    from cluster import serve_app

    first = 32768
    chosen = serve_app._port_block(first, random.Random(3))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", chosen + 201))  # the metrics port of that block, taken by someone else
        taken.listen()
        again = serve_app._port_block(first, random.Random(3))
    assert again != chosen and 20000 <= again < first - 204


def test_without_room_below_the_ephemeral_ports_the_range_still_fits_in_the_port_space():
    import random

    from cluster.serve_app import _ephemeral_start, _port_block

    rng = random.Random(0)
    assert all(20000 <= _port_block(20100, rng) <= 60000 - 204 for _ in range(50))
    assert 1024 <= _ephemeral_start() <= 65535  # this machine's, read from the kernel
