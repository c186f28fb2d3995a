"""The embedded default layout, `proxy.colocate: true` (configs/local.yaml): the Proxy's routes and vLLM in
ONE `PolicyEngine` replica, with the official SDKs, hot-swap and a `Proxy` deployment in front of it.

The session fixture runs the two-deployment layout (see tests/conftest.py); this module deploys the
co-located app the production builder makes from the embedded default, as a second Serve app
(`clawray-colo`, route `/colo`) with its own storage root and its own vLLM engine.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.helpers import publish_adapters, session_turns, wait_for

pytestmark = pytest.mark.slow

ADMIN = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}
APP, FRONT = "clawray-colo", "clawray-colo-front"


def _sid() -> str:
    return f"colo-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def colo(serve_app, tmp_path_factory):
    """The co-located app built from configs/local.yaml as shipped (own storage root; served by the
    session's Serve HTTP proxy)."""
    from ray import serve

    from cluster.serve_app import build_app
    from core.config import load_config
    from tests.conftest import REPO

    env = {**os.environ, "CLAWRAY__STORAGE_ROOT": str(tmp_path_factory.mktemp("colo-storage"))}
    cfg = load_config(REPO / "configs" / "local.yaml", env=env)
    assert cfg.proxy.colocate, "the embedded default is the co-located layout"
    serve.run(build_app(cfg), name=APP, route_prefix="/colo", blocking=False)
    base = serve_app["base_url"] + "/colo"
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    else:
        pytest.fail("the co-located app did not become healthy within 300 s")
    yield {"base_url": base, "config": cfg}
    for name in (FRONT, APP):
        serve.delete(name)


def _turns(cfg, session_id: str, want: int = 1, timeout: float = 15.0):
    """The session's turns once there are `want` of them (or what is there after `timeout`)."""
    root = cfg.storage_path()
    return wait_for(lambda: len(t := session_turns(root, session_id)) >= want and t, timeout, 0.2) or \
        session_turns(root, session_id)


def test_one_deployment_serves_both_protocols_with_token_exact_capture(colo):
    from ray import serve
    from transformers import AutoTokenizer

    status = serve.status().applications[APP]
    assert set(status.deployments) == {"PolicyEngine"}  # no separate Proxy deployment, no handle hop
    client = openai.OpenAI(base_url=colo["base_url"] + "/v1", api_key="unused", max_retries=0)
    tok = AutoTokenizer.from_pretrained(colo["config"].model_path())

    sid = _sid()
    raw = client.chat.completions.with_raw_response.create(
        model="clawray-policy", messages=[{"role": "user", "content": "Say hello"}], max_tokens=8,
        extra_headers={"X-Session-Id": sid})
    r = raw.parse()
    assert raw.headers["x-session-id"] == sid and raw.headers["x-clawray-replica"]
    (turn,) = _turns(colo["config"], sid)
    # The text the client got is the turn's text and the decoded sampled ids (bar a trailing incomplete
    # UTF-8 character, which vLLM's detokenizer holds back at the end of a random tiny model's reply).
    assert turn.response_text == (r.choices[0].message.content or "")
    assert tok.decode(turn.response_ids, skip_special_tokens=True).startswith(turn.response_text)
    assert len(turn.response_logprobs) == len(turn.response_ids) == r.usage.completion_tokens

    sid = _sid()
    stream = client.chat.completions.create(
        model="clawray-policy", messages=[{"role": "user", "content": "Count to three"}], max_tokens=10,
        stream=True, stream_options={"include_usage": True}, extra_headers={"X-Session-Id": sid})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    (turn,) = _turns(colo["config"], sid)
    assert turn.response_text == text and len(turn.response_ids) == chunks[-1].usage.completion_tokens

    claude = anthropic.Anthropic(base_url=colo["base_url"], api_key="unused", max_retries=0)
    sid = _sid()
    with claude.messages.stream(model="clawray-policy", max_tokens=8, system="Be brief.",
                                messages=[{"role": "user", "content": "hi"}],
                                extra_headers={"X-Session-Id": sid}) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens > 0
    (turn,) = _turns(colo["config"], sid)
    assert len(turn.response_ids) == final.usage.output_tokens

    ids = [m.id for m in client.models.list().data]
    assert "clawray-base" in ids and "clawray-policy" in ids


def test_client_going_away_mid_stream_leaves_the_replica_serving(colo):
    """The in-process stream is closed (the engine aborts its vLLM request); the replica goes on."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a long story"}],
            "max_tokens": 200, "stream": True}
    sid = _sid()
    with httpx.stream("POST", colo["base_url"] + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Session-Id": sid}) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # one event, then hang up
    client = openai.OpenAI(base_url=colo["base_url"] + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.choices[0].message.content is not None
    assert httpx.get(colo["base_url"] + "/healthz", timeout=30).json()["status"] == "ok"


def test_hot_swap_through_the_admin_routes_and_the_engine_handle(colo):
    """Admin routes and the trainer's path (a `PolicyEngine` handle, found by name) both reach the engine
    inside the co-located replica; turns record the version that produced them."""
    from ray import serve

    cfg = colo["config"]
    v1, v2 = publish_adapters(cfg.model_path(), Path(cfg.storage_path()) / "adapters", 2)
    admin = httpx.Client(base_url=colo["base_url"], headers=ADMIN, timeout=120)
    assert admin.post(f"/admin/adapters/{v1}/load").status_code == 200
    assert admin.post(f"/admin/adapters/{v1}/activate").status_code == 200
    client = openai.OpenAI(base_url=colo["base_url"] + "/v1", api_key="unused", max_retries=0)
    sid = _sid()
    client.chat.completions.create(model="clawray-policy", messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=4, extra_headers={"X-Session-Id": sid})
    assert _turns(cfg, sid)[0].adapter_version == v1

    engine = serve.get_deployment_handle("PolicyEngine", app_name=APP)
    engine.load_adapter.remote(v2).result(timeout_s=120)
    assert engine.activate.remote(v2).result(timeout_s=60)["active"] == v2
    sid = _sid()
    client.chat.completions.create(model="clawray-policy", messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=4, extra_headers={"X-Session-Id": sid})
    assert _turns(cfg, sid)[0].adapter_version == v2
    listed = admin.get("/admin/adapters").json()
    assert listed["active"] == v2 and {v1, v2} <= set(listed["loaded"])
    assert admin.post("/admin/adapters/base/activate").status_code == 200


def test_a_proxy_deployment_can_front_the_colocated_engine(colo):
    """The co-located deployment answers the engine's whole handle interface, so more ingress replicas can
    be added in front of it without more vLLM engines."""
    from ray import serve

    from cluster.serve_app import build_proxy

    cfg = colo["config"]
    engine = serve.get_deployment_handle("PolicyEngine", app_name=APP)
    serve.run(build_proxy(cfg, engine), name=FRONT, route_prefix="/colofront")
    base = colo["base_url"].removesuffix("/colo") + "/colofront"
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    sid = _sid()
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Count to three"}], max_tokens=8, stream=True,
        extra_headers={"X-Session-Id": sid})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    (turn,) = _turns(cfg, sid)
    assert turn.response_text == text and turn.response_ids
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.usage.completion_tokens > 0
    assert httpx.post(base + "/v1/messages/count_tokens", timeout=30, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]}).json()["input_tokens"] > 0
