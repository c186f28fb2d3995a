"""Sessions, safety and metrics at the Proxy, against the real engine.

A second Serve app (`clawray-aux`, route `/aux`) puts two more Proxy replicas in front of the SAME running
PolicyEngine (a handle to it, no second vLLM), with its own storage root, an API key, a short idle
timeout and a small body limit. The restart test kills the main app's Proxy replica.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.helpers import session_turns

pytestmark = pytest.mark.slow

KEY = "sk-clawray-test-proxy-key"
KEY_ENV = "CLAWRAY_TEST_PROXY_KEY"
# Like the admin key in conftest: set before Ray starts (collection precedes fixtures), so replicas inherit
# it as they would in production. Passing it in a runtime_env would put it into Ray's own logs.
os.environ.setdefault(KEY_ENV, KEY)
ADMIN_HEADERS = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}
IDLE_S = 6.0
MAX_BODY = 64 * 1024


def _sid() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def _turns(root: Path, sid: str | None = None):
    return session_turns(root, sid)


@pytest.fixture(scope="module")
def aux(serve_app, tmp_path_factory):
    """Two Proxy replicas in front of the running engine, with a key, IDLE_S idle flush, MAX_BODY limit."""
    from ray import serve

    from core.config import ProxyConfig
    from serve.proxy import PROXY_REPLICA_ENV, Proxy

    root = tmp_path_factory.mktemp("aux-storage")
    cfg = serve_app["config"]
    proxy = ProxyConfig(api_key_env=KEY_ENV, session_idle_timeout_s=IDLE_S, max_body_bytes=MAX_BODY,
                        num_replicas=2)
    engine = serve.get_deployment_handle("PolicyEngine", app_name="clawray")
    env = dict(PROXY_REPLICA_ENV)
    app = Proxy.options(num_replicas=2, ray_actor_options={"num_cpus": 0.25, "runtime_env": {"env_vars": env}}
                        ).bind(engine, proxy.model_dump(), cfg.skills.model_dump(), str(root))
    serve.run(app, name="clawray-aux", route_prefix="/aux")
    base = serve_app["base_url"] + "/aux"
    yield {"base": base, "root": root,
           "client": openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)}
    serve.delete("clawray-aux")


def _chat(base: str, headers: dict, body: bytes | dict | None = None) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    kw = {"content": body} if isinstance(body, bytes) else {"json": body or payload}
    return httpx.post(base + "/v1/chat/completions", headers=headers, timeout=60, **kw)


# ---- sessions -------------------------------------------------------------------------------------------

def test_an_idle_session_is_flushed_as_last_turn(aux):
    sid = _sid()
    aux["client"].chat.completions.create(model="m", messages=[{"role": "user", "content": "idle?"}],
                                          max_tokens=3, extra_headers={"X-Session-Id": sid})
    (turn,) = _turns(aux["root"], sid)
    assert not turn.last_in_session
    deadline = time.time() + IDLE_S + 20
    while time.time() < deadline:
        turn = _turns(aux["root"], sid)[0]
        if turn.last_in_session:
            break
        time.sleep(0.5)
    assert turn.last_in_session and turn.next_state is None
    sink = (Path(aux["root"]) / "sessions" / "completed.jsonl").read_text().splitlines()
    assert any(json.loads(line)["session_id"] == sid for line in sink)  # handed to the scoring sink


def test_two_replicas_serve_one_session(aux):
    sid, msgs, replicas = _sid(), [{"role": "user", "content": "start"}], []
    client = aux["client"].with_options(default_headers={"X-Session-Id": sid})
    while len(replicas) < 4 or (len(set(replicas)) < 2 and len(replicas) < 24):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=3)
        replicas.append(raw.headers["x-clawray-replica"])
        msgs = msgs + [{"role": "assistant", "content": raw.parse().choices[0].message.content or ""},
                       {"role": "user", "content": f"next {len(replicas)}"}]
    assert len(set(replicas)) == 2
    turns = _turns(aux["root"], sid)
    assert [t.turn_index for t in turns] == list(range(len(replicas)))
    for i, t in enumerate(turns[:-1]):  # every turn was completed by the next one, whichever replica
        assert t.next_state == [{"role": "user", "content": f"next {i + 1}"}]


def test_side_turns_are_served_but_never_stored(aux):
    sid = _sid()
    c = aux["client"]
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "main"}], max_tokens=3,
                              extra_headers={"X-Session-Id": sid})
    side = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "title?"}], max_tokens=3,
                                     extra_headers={"X-Session-Id": sid, "X-Turn-Type": "side"})
    assert side.choices[0].message is not None
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "also side"}], max_tokens=3,
                              extra_body={"session_id": sid, "turn_type": "side"})  # the body fields too
    (turn,) = _turns(aux["root"], sid)
    assert turn.turn_type.value == "main" and turn.next_state is None and not turn.last_in_session


def test_session_done_header_and_end_route_flush_the_last_turn(aux):
    sid, c = _sid(), aux["client"]
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "bye"}], max_tokens=3,
                              extra_headers={"X-Session-Id": sid, "X-Session-Done": "true"})
    (turn,) = _turns(aux["root"], sid)
    assert turn.last_in_session
    sid2 = _sid()
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                              extra_headers={"X-Session-Id": sid2})
    r = httpx.post(f"{aux['base']}/v1/sessions/{sid2}/end", headers={"Authorization": f"Bearer {KEY}"})
    assert r.json() == {"session_id": sid2, "flushed": 1}
    assert _turns(aux["root"], sid2)[0].last_in_session


def test_derived_session_ids_do_not_merge_clients(serve_app):
    marker = uuid.uuid4().hex
    msgs = [{"role": "user", "content": f"plan my day {marker}"}]
    url = serve_app["base_url"] + "/v1"
    sids, replies = [], []
    for key, agent in (("key-a", "agent/1"), ("key-b", "agent/1"), ("key-a", "agent/2")):
        c = openai.OpenAI(base_url=url, api_key=key, max_retries=0, default_headers={"User-Agent": agent})
        raw = c.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=3)
        sids.append(raw.headers["x-session-id"])
        replies.append(raw.parse().choices[0].message.content or "")
    assert len(set(sids)) == 3 and all(s.startswith("derived-") for s in sids)
    c = openai.OpenAI(base_url=url, api_key="key-a", max_retries=0, default_headers={"User-Agent": "agent/1"})
    follow = msgs + [{"role": "assistant", "content": replies[0]}, {"role": "user", "content": "and tomorrow?"}]
    raw = c.chat.completions.with_raw_response.create(model="m", messages=follow, max_tokens=3)
    assert raw.headers["x-session-id"] == sids[0]  # the same client's conversation continues
    first, second = _turns(Path(serve_app["config"].storage_path()), sids[0])
    assert first.next_state == [{"role": "user", "content": "and tomorrow?"}] and second.turn_index == 1


def test_sessions_survive_a_proxy_replica_restart(serve_app, openai_client):
    import ray

    sid = _sid()
    msgs = [{"role": "user", "content": "before the restart"}]
    raw = openai_client.chat.completions.with_raw_response.create(
        model="m", messages=msgs, max_tokens=3, extra_headers={"X-Session-Id": sid})
    before = raw.headers["x-clawray-replica"]
    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith("SERVE_REPLICA::clawray#Proxy#")]
    assert names
    for a in names:
        ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=True)
    deadline, after = time.time() + 120, before
    while time.time() < deadline and after == before:
        try:
            r = httpx.get(serve_app["base_url"] + "/healthz", timeout=10)
            after = r.headers.get("x-clawray-replica", before) if r.status_code == 200 else before
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    follow = msgs + [{"role": "assistant", "content": raw.parse().choices[0].message.content or ""},
                     {"role": "user", "content": "after the restart"}]
    raw = openai_client.chat.completions.with_raw_response.create(
        model="m", messages=follow, max_tokens=3, extra_headers={"X-Session-Id": sid})
    assert raw.headers["x-clawray-replica"] != before  # a new replica served it
    first, second = _turns(Path(serve_app["config"].storage_path()), sid)
    assert first.next_state == [{"role": "user", "content": "after the restart"}]
    assert (first.turn_index, second.turn_index) == (0, 1)


# ---- safety ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                                     {"Authorization": f"Basic {KEY}"}])
def test_a_missing_or_wrong_key_is_401(aux, headers):
    r = _chat(aux["base"], headers)
    assert r.status_code == 401 and r.json()["error"]["message"] == "missing or invalid API key"
    r = httpx.post(aux["base"] + "/v1/messages", headers=headers, timeout=30,
                   json={"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_the_key_works_as_bearer_and_x_api_key_with_both_sdks(aux):
    assert aux["client"].chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices
    msgs = [{"role": "user", "content": "hi"}]
    for client in (anthropic.Anthropic(base_url=aux["base"], api_key=KEY, max_retries=0),  # x-api-key
                   anthropic.Anthropic(base_url=aux["base"], auth_token=KEY, max_retries=0)):  # Bearer
        assert client.messages.create(model="m", max_tokens=2, messages=msgs).content
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=aux["base"], api_key="nope", max_retries=0).messages.create(
            model="m", max_tokens=2, messages=msgs)


def test_admin_key_and_api_key_are_separate(aux):
    assert httpx.get(aux["base"] + "/admin/adapters", headers={"x-admin-key": KEY}).status_code == 401
    assert httpx.get(aux["base"] + "/admin/adapters", headers={"Authorization": f"Bearer {KEY}"}
                     ).status_code == 401
    assert _chat(aux["base"], ADMIN_HEADERS).status_code == 401
    assert httpx.get(aux["base"] + "/admin/adapters", headers=ADMIN_HEADERS).status_code == 200


def test_body_limit_and_bad_bytes(aux):
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
    r = _chat(aux["base"], auth, big)
    assert r.status_code == 413 and str(MAX_BODY) in r.json()["error"]["message"]
    r = _chat(aux["base"], auth, b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}')
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]


# ---- observability --------------------------------------------------------------------------------------

def test_metrics_are_exported(aux):
    import ray

    assert _chat(aux["base"], {"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert _chat(aux["base"], {}).status_code == 401
    port = ray.nodes()[0]["MetricsExportPort"]
    want = ['route="chat",status="200"', 'route="chat",status="401"', "ray_clawray_proxy_latency_seconds_bucket",
            "ray_clawray_proxy_tokens_total", "ray_clawray_engine_inflight_requests"]
    deadline, text = time.time() + 90, ""  # Ray's metrics agent exports every few seconds
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        if all(w in text for w in want):
            break
        time.sleep(2)
    assert [w for w in want if w not in text] == []


def test_no_prompt_or_key_in_the_logs(aux):
    import ray

    secret_prompt = f"PROMPT-MARKER-{uuid.uuid4().hex}"
    aux["client"].chat.completions.create(model="m", messages=[{"role": "user", "content": secret_prompt}],
                                          max_tokens=3)
    _chat(aux["base"], {"Authorization": f"Bearer {KEY}-wrong"})
    time.sleep(2)  # let log monitors flush
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    for f in logs.rglob("*"):
        if f.is_file() and f.stat().st_size < 50_000_000:
            text = f.read_text(errors="ignore")
            assert secret_prompt not in text, f"prompt logged in {f}"
            assert KEY not in text, f"API key logged in {f}"
