"""The Proxy's edge without Ray: body limits, UTF-8, keys, startup safety checks, group commit, logging."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from core.config import ConfigError, load_config
from core.contracts import Turn
from serve.http import key_matches, presented_key, read_json_body
from serve.recorder import GroupCommit
from serve.sessions import SessionStore
from serve.turns import RequestError


def _request(body: bytes, headers: dict[str, str] | None = None, chunk: int = 1 << 20) -> Request:
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

    async def receive():
        return messages.pop(0)

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw}, receive)


def _read(body: bytes, limit: int = 1024, **kw):
    return asyncio.run(read_json_body(_request(body, **kw), limit))


def test_body_over_the_limit_is_413_declared_or_streamed():
    big = b'{"x": "' + b"a" * 5000 + b'"}'
    with pytest.raises(RequestError) as e:
        _read(big, headers={"content-length": str(len(big))})
    assert e.value.status == 413
    with pytest.raises(RequestError) as e:  # no Content-Length (chunked): counted while reading
        _read(big, chunk=100)
    assert e.value.status == 413


@pytest.mark.parametrize("payload, fragment", [
    (b'{"a": "\xff\xfe"}', "UTF-8"), (b"{nope", "not valid JSON"), (b"[1]", "JSON object")])
def test_bad_bodies_are_400_with_a_reason(payload, fragment):
    with pytest.raises(RequestError) as e:
        _read(payload)
    assert e.value.status == 400 and fragment in str(e.value)


def test_keys_from_bearer_or_x_api_key_compared_in_constant_time():
    assert presented_key(_request(b"", {"Authorization": "Bearer k1"})) == "k1"
    assert presented_key(_request(b"", {"x-api-key": "k2"})) == "k2"
    assert key_matches("k1", "k1") and not key_matches("k2", "k1") and not key_matches(None, "k1")
    assert key_matches(None, None)  # no key configured (loopback only, see below)


def _cfg(**env):
    base = {"CLAWRAY__MODEL__PATH": "/nonexistent-model"}  # not "tiny": the check would build it
    return load_config(env={**base, **{f"CLAWRAY__{k}": v for k, v in env.items()}})


def test_proxy_beyond_loopback_refuses_to_start_without_a_key():
    from cluster.serve_app import check_serving_config

    cfg = _cfg(PROXY__HOST="0.0.0.0")
    with pytest.raises(ConfigError, match="not loopback"):
        check_serving_config(cfg, env={})
    check_serving_config(cfg, env={"CLAWRAY_API_KEY": "k"})  # with a key it may start
    check_serving_config(_cfg(), env={})  # loopback without a key is allowed
    with pytest.raises(ConfigError, match="all interfaces"):  # ... unless Ray's HAProxy opens its stats page
        check_serving_config(_cfg(), env={"RAY_SERVE_ENABLE_HA_PROXY": "1"})


def test_haproxy_without_a_key_needs_clawrays_strict_loopback_wrapper(tmp_path):
    from cluster.haproxy_loopback import write_wrapper
    from cluster.serve_app import check_serving_config

    strict = write_wrapper(tmp_path, "/bin/true", [1, 2], strict=True)
    haproxy = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_BINARY_PATH": str(strict)}
    check_serving_config(_cfg(), env=haproxy)
    check_serving_config(_cfg(PROXY__HTTP_INGRESS="haproxy"), env={"RAY_SERVE_HAPROXY_BINARY_PATH": str(strict)})
    (tmp_path / "lax").mkdir()
    lax = write_wrapper(tmp_path / "lax", "/bin/true", [1, 2], strict=False)
    for env in ({**haproxy, "RAY_SERVE_HAPROXY_BINARY_PATH": str(lax)}, {"RAY_SERVE_ENABLE_HA_PROXY": "1"}):
        with pytest.raises(ConfigError, match="all interfaces"):
            check_serving_config(_cfg(), env=env)
    with pytest.raises(ConfigError, match="not loopback"):  # beyond loopback a key is needed anyway
        check_serving_config(_cfg(PROXY__HOST="0.0.0.0"), env=haproxy)


def test_upstream_mode_checks_its_url_and_key_env():
    from cluster.serve_app import check_serving_config

    up = {"ENGINE__BACKEND": "upstream", "ENGINE__UPSTREAM": "{base_url: 'http://127.0.0.1:9/v1', "
          "model: m, api_key_env: UPSTREAM_KEY}"}
    with pytest.raises(ConfigError, match="UPSTREAM_KEY"):
        check_serving_config(_cfg(**up), env={})
    check_serving_config(_cfg(**up), env={"UPSTREAM_KEY": "k"})
    bad = {**up, "ENGINE__UPSTREAM": "{base_url: 'ftp://x', model: m}"}
    with pytest.raises(ConfigError, match="http"):
        check_serving_config(_cfg(**bad), env={})


def test_vllm_request_logging_stays_off():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from core.config import EngineConfig, ModelConfig
    from serve.vllm_engine import vllm_cli_args

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        vllm_cli_args("/m", ModelConfig(), EngineConfig()))
    assert not args.enable_log_requests and not args.enable_log_outputs


def _turn(sid: str) -> Turn:
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0])


def test_group_commit_batches_concurrent_records_and_keeps_session_order(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    rec = GroupCommit(store)

    async def run():
        first = [rec.record([_turn(f"s{i % 4}")], None) for i in range(40)]
        return await asyncio.gather(*first)

    stored = asyncio.run(run())
    assert rec.commits < 40  # concurrent requests shared transactions
    for s in range(4):
        idx = [t[0].turn_index for i, t in enumerate(stored) if i % 4 == s]
        assert idx == list(range(10))  # same order as the calls, as if recorded one by one
    assert len(store.turns()) == 40


def test_group_commit_isolates_a_failing_record(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    rec = GroupCommit(store)
    dup = _turn("a")

    async def run():
        return await asyncio.gather(rec.record([dup], None), rec.record([dup], None),
                                    rec.record([_turn("b")], None), return_exceptions=True)

    ok1, err, ok2 = asyncio.run(run())
    assert isinstance(err, Exception) and not isinstance(ok1, Exception) and not isinstance(ok2, Exception)
    assert {t.session_id for t in store.turns()} == {"a", "b"}


def test_the_app_builder_never_builds_the_tiny_model(tmp_path):
    """Building the model belongs to setup (`make model`); the builder only says it is missing."""
    from cluster.serve_app import check_serving_config
    from core.config import REPO_ROOT as REPO
    from core.config import config_from_dict

    cfg = config_from_dict({"cache_dir": str(tmp_path), "model": {"path": "tiny"}})
    with pytest.raises(ConfigError, match="make model"):
        check_serving_config(cfg, env={})
    assert not (tmp_path / "tiny-chat").exists()
    src = "\n".join(p.read_text() for p in (REPO / "cluster").glob("*.py"))
    assert "from scripts" not in src and "import scripts" not in src  # cluster/ imports nothing above it


def test_the_haproxy_ingress_key_keeps_haproxys_files_private_and_its_ports_free():
    import shutil
    import socket
    import stat
    from pathlib import Path

    from cluster.haproxy_loopback import is_strict_wrapper
    from cluster.serve_app import ingress_env

    assert ingress_env(_cfg(PROXY__HTTP_INGRESS="serve")) == {}  # Serve's own HTTP proxy: nothing to set
    assert ingress_env(_cfg(PROXY__HOST="0.0.0.0")) == {}  # auto: HAProxy only with a loopback host
    env = ingress_env(_cfg())  # auto, loopback: HAProxy
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    private = Path(env["RAY_SERVE_HAPROXY_SOCKET_PATH"]).parent
    try:
        # Served through clawray's wrapper, strict: every HAProxy listener on loopback.
        wrapper = Path(env["RAY_SERVE_HAPROXY_BINARY_PATH"])
        assert wrapper.parent == private and is_strict_wrapper(str(wrapper))
        assert f"--ports {env['RAY_SERVE_HAPROXY_STATS_PORT']},{env['RAY_SERVE_HAPROXY_METRICS_PORT']}" in (
            wrapper.read_text())
        # Ray's default folder is /tmp/haproxy-serve, shared by every user, with an admin socket of mode 666.
        assert stat.S_IMODE(private.stat().st_mode) == 0o700 and private != Path("/tmp/haproxy-serve")
        for name in ("CONFIG_FILE_LOC", "SERVER_STATE_FILE", "METRICS_SOCKET_PATH"):
            assert Path(env[f"RAY_SERVE_HAPROXY_{name}"]).parent == private
        # Serve puts HAProxy's sockets under <folder>/<node id (56 hex)>/; HAProxy takes at most 97 bytes.
        assert len(env["RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"]) + 57 <= 97
        for name in ("STATS_PORT", "METRICS_PORT"):  # Ray's fixed 8404/9101 collide with other clusters
            with socket.socket() as s:
                s.bind(("127.0.0.1", int(env[f"RAY_SERVE_HAPROXY_{name}"])))
    finally:
        shutil.rmtree(private)


def test_haproxys_request_metrics_are_off_and_its_threads_fit_the_host_unless_the_env_says_otherwise(monkeypatch):
    import os
    import shutil
    from pathlib import Path

    from cluster.serve_app import ingress_env

    monkeypatch.delenv("RAY_SERVE_HAPROXY_METRICS_ENABLED", raising=False)
    monkeypatch.delenv("RAY_SERVE_HAPROXY_NBTHREAD", raising=False)
    made = []
    try:
        env = ingress_env(_cfg(PROXY__HTTP_INGRESS="haproxy"))
        made.append(env)
        assert env["RAY_SERVE_HAPROXY_METRICS_ENABLED"] == "0"
        assert env["RAY_SERVE_HAPROXY_NBTHREAD"] == str(min(4, os.cpu_count() or 1))
        on = ingress_env(_cfg(PROXY__HTTP_INGRESS="haproxy", PROXY__HAPROXY_SERVE_METRICS="true"))
        made.append(on)
        assert on["RAY_SERVE_HAPROXY_METRICS_ENABLED"] == "1"
        monkeypatch.setenv("RAY_SERVE_HAPROXY_METRICS_ENABLED", "1")  # the operator's own setting stays
        monkeypatch.setenv("RAY_SERVE_HAPROXY_NBTHREAD", "8")
        mine = ingress_env(_cfg(PROXY__HTTP_INGRESS="haproxy"))
        made.append(mine)
        assert "RAY_SERVE_HAPROXY_METRICS_ENABLED" not in mine and "RAY_SERVE_HAPROXY_NBTHREAD" not in mine
        # One node's HAProxy (a loopback host) deregisters a stopping replica at once: no 30 s drain.
        assert mine["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2"
        wide = ingress_env(_cfg(PROXY__HTTP_INGRESS="haproxy", PROXY__HOST="0.0.0.0"))
        made.append(wide)
        assert "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S" not in wide  # other nodes' HAProxies: Serve's
    finally:
        for e in made:
            shutil.rmtree(Path(e["RAY_SERVE_HAPROXY_SOCKET_PATH"]).parent, ignore_errors=True)


def test_starting_sweeps_the_haproxy_folders_of_clusters_that_are_gone():
    import os
    import shutil
    import socket
    import tempfile
    import time
    from pathlib import Path

    from cluster.serve_app import sweep_stale_haproxy_dirs

    def folder(name: str, age_s: float, listening: bool = False):
        node = tmp_path / name / "node"  # Serve's is the 56-hex node id (a unix socket path has ~100 bytes)
        node.mkdir(parents=True)
        (node / "haproxy.cfg").write_text("global\n")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(node / "admin.sock"))
        if listening:
            sock.listen(1)
        else:
            sock.close()  # the file stays, as a dead HAProxy leaves it
        old = time.time() - age_s
        for p in (node / "haproxy.cfg", node / "admin.sock", node, node.parent):
            os.utime(p, (old, old), follow_symlinks=False)
        return sock

    tmp_path = Path(tempfile.mkdtemp(prefix="sw-", dir="/tmp"))
    folder("cr-ha-gone", 3600)
    folder("cr-ha-starting", 5)  # a cluster being set up right now: its HAProxy may not run yet
    live = folder("cr-ha-live", 3600, listening=True)
    folder("someone-else", 3600)
    try:
        removed = sweep_stale_haproxy_dirs(tmp_path)
        assert [p.name for p in removed] == ["cr-ha-gone"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cr-ha-live", "cr-ha-starting", "someone-else"]
    finally:
        live.close()
        shutil.rmtree(tmp_path)


def test_each_haproxy_start_removes_the_folder_an_earlier_cluster_left_behind(monkeypatch):
    """The defect: every HAProxy start made /tmp/cr-ha-* and nothing ever removed it (27 had piled up)."""
    import os
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from cluster.serve_app import HAPROXY_DIR_PREFIX, ingress_env

    monkeypatch.delenv("RAY_SERVE_HAPROXY_METRICS_ENABLED", raising=False)
    left = Path(tempfile.mkdtemp(prefix=HAPROXY_DIR_PREFIX, dir="/tmp"))  # a cluster that stopped an hour ago
    node = left / "node"
    node.mkdir()
    (node / "haproxy.cfg").write_text("global\n")
    old = time.time() - 3600
    for p in (node / "haproxy.cfg", node, left):
        os.utime(p, (old, old))
    env = {}
    try:
        env = ingress_env(_cfg(PROXY__HTTP_INGRESS="haproxy"))
        assert not left.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        if env:
            shutil.rmtree(Path(env["RAY_SERVE_HAPROXY_SOCKET_PATH"]).parent, ignore_errors=True)


def test_a_streams_last_event_goes_out_with_the_end_of_the_response():
    """serve/http.py `EventStream`: the final event ([DONE]) and the end of the body are one ASGI message, so
    uvicorn writes them (and the chunked terminator) at once; a client that closes at [DONE] no longer races
    the terminator (Hermes behind HAProxy did, and its exchanges ended cut off)."""
    from serve.http import EventStream, LastEvent

    closed = []

    async def events():
        try:
            yield "data: a\n\n"
            yield b"data: b\n\n"
            yield LastEvent("data: [DONE]\n\n")
            yield "never sent"
        finally:
            closed.append(True)

    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(EventStream(events(), media_type="text/event-stream").stream_response(send))
    assert [(m.get("body"), m.get("more_body")) for m in sent[1:]] == [
        (b"data: a\n\n", True), (b"data: b\n\n", True), (b"data: [DONE]\n\n", False)]
    assert closed == [True]

    async def plain():
        yield "data: a\n\n"

    sent.clear()
    asyncio.run(EventStream(plain()).stream_response(send))  # no last event: Starlette's empty end of body
    assert [(m.get("body"), m.get("more_body")) for m in sent[1:]] == [(b"data: a\n\n", True), (b"", False)]
