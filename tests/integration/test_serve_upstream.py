"""Upstream mode end to end: a second clawray app (`clawray-up`, route `/up`) whose engine is an
`UpstreamEngine` forwarding to a real, separate OpenAI-compatible server.

The upstream server is the test session's own clawray endpoint (`/v1` of the main app: vLLM's OpenAI
serving layer on the tiny model), not a second vLLM: starting another engine would cost ~30 s and a
core on CI. Because that upstream is itself a clawray Proxy, it also shows that clawray's headers never
leave the downstream Proxy: a session id sent to `/up` must not appear in the upstream's session store.
"""

from __future__ import annotations

import json
import os
import uuid

import anthropic
import httpx
import openai
import pytest

from tests.integration.helpers import session_turns

pytestmark = pytest.mark.slow

UP_KEY_ENV = "CLAWRAY_TEST_UPSTREAM_KEY"
UP_KEY = "sk-upstream-test-secret-7f3a"
os.environ.setdefault(UP_KEY_ENV, UP_KEY)  # before Ray starts (collection precedes fixtures): inherited
ADMIN = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}


def _turns(root, sid=None):
    return session_turns(root, sid)


@pytest.fixture(scope="module")
def up(serve_app, tmp_path_factory):
    from ray import serve

    from cluster.serve_app import build_engine, build_proxy, check_serving_config
    from core.config import load_config

    root = tmp_path_factory.mktemp("up-storage")
    upstream = {"base_url": serve_app["base_url"] + "/v1", "model": serve_app["config"].model.served_name,
                "api_key_env": UP_KEY_ENV, "timeout_s": 60, "max_retries": 1}
    env = {**os.environ, "CLAWRAY__STORAGE_ROOT": str(root), "CLAWRAY__ENGINE__BACKEND": "upstream",
           "CLAWRAY__ENGINE__UPSTREAM": json.dumps(upstream), "CLAWRAY__ENGINE__NUM_CPUS": "0.25",
           "CLAWRAY__PROXY__NUM_CPUS": "0.25"}
    cfg = load_config(env=env)
    check_serving_config(cfg)
    serve.run(build_proxy(cfg, build_engine(cfg)), name="clawray-up", route_prefix="/up")
    base = serve_app["base_url"] + "/up"
    yield {"base": base, "root": root, "main_root": serve_app["config"].storage_path(),
           "client": openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)}
    serve.delete("clawray-up")


def test_chat_is_captured_token_exact_and_the_client_sees_only_what_it_asked(up):
    sid = f"up-{uuid.uuid4().hex[:10]}"
    r = up["client"].chat.completions.with_raw_response.create(
        model="clawray-policy", messages=[{"role": "user", "content": "hello upstream"}], max_tokens=6,
        extra_headers={"X-Session-Id": sid}, extra_body={"user_id": "u1"})
    body = json.loads(r.text)
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["choices"][0].get("logprobs") is None
    (turn,) = _turns(up["root"], sid)
    assert turn.tenant == "u1/default" and turn.prompt_ids
    assert len(turn.response_ids) == len(turn.response_logprobs) == body["usage"]["completion_tokens"]
    assert turn.response_text == body["choices"][0]["message"]["content"]
    assert _turns(up["main_root"], sid) == []  # the session header never reached the upstream


def test_stream_with_usage_and_asked_logprobs(up):
    sid = f"up-{uuid.uuid4().hex[:10]}"
    chunks = list(up["client"].chat.completions.create(
        model="m", messages=[{"role": "user", "content": "stream please"}], max_tokens=6, stream=True,
        logprobs=True, stream_options={"include_usage": True}, extra_headers={"X-Session-Id": sid}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    shown = [lp.logprob for c in chunks if c.choices and c.choices[0].logprobs
             for lp in c.choices[0].logprobs.content]
    assert all(getattr(c.choices[0], "token_ids", None) is None for c in chunks if c.choices)
    (turn,) = _turns(up["root"], sid)
    assert turn.response_logprobs == pytest.approx(shown, abs=1e-4)
    assert len(turn.response_ids) == chunks[-1].usage.completion_tokens


def test_upstream_errors_are_clear_and_keep_the_key_secret(up):
    r = httpx.post(up["base"] + "/v1/chat/completions", timeout=60,
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5})
    err = r.json()["error"]
    assert r.status_code == 400 and err["message"].startswith("the upstream model refused the request")
    assert UP_KEY not in r.text and "Traceback" not in r.text and "/v1" not in err["message"]


def test_anthropic_over_upstream(up):
    client = anthropic.Anthropic(base_url=up["base"], api_key="unused", max_retries=0)
    sid = f"up-{uuid.uuid4().hex[:10]}"
    m = client.messages.create(model="claude-x", max_tokens=6, system="be brief",
                               messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Session-Id": sid})
    assert m.type == "message" and m.content[0].type == "text" and m.usage.output_tokens > 0
    with client.messages.stream(model="claude-x", max_tokens=6, messages=[{"role": "user", "content": "yo"}],
                                extra_headers={"X-Session-Id": sid}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    first, second = _turns(up["root"], sid)
    assert first.messages[0] == {"role": "system", "content": "be brief"}
    assert len(first.response_ids) == m.usage.output_tokens
    assert len(second.response_ids) == final.usage.output_tokens == len(second.response_logprobs)


def test_what_upstream_mode_refuses(up):
    r = httpx.post(up["base"] + "/v1/messages/count_tokens", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 501 and "upstream mode" in r.json()["error"]["message"]
    r = httpx.post(up["base"] + "/admin/adapters/policy-v0001/activate", headers=ADMIN, timeout=30)
    assert r.status_code == 409 and "upstream mode" in r.json()["error"]["message"]
    ids = [m.id for m in up["client"].models.list().data]
    assert ids[:2] == ["clawray-base", "clawray-policy"]


def test_colocated_mode_serves_the_same_routes_from_one_replica(serve_app, tmp_path_factory):
    """`proxy.colocate`: Proxy routes and engine in one `PolicyEngine` replica (here with the upstream engine,
    so no second vLLM starts); the engine's handle methods stay reachable by name."""
    from ray import serve

    from cluster.serve_app import build_app
    from core.config import load_config
    from serve.protocol import EngineRequestError

    root = tmp_path_factory.mktemp("colo-storage")
    upstream = {"base_url": serve_app["base_url"] + "/v1", "model": serve_app["config"].model.served_name}
    cfg = load_config(env={**os.environ, "CLAWRAY__STORAGE_ROOT": str(root), "CLAWRAY__ENGINE__BACKEND": "upstream",
                           "CLAWRAY__ENGINE__UPSTREAM": json.dumps(upstream), "CLAWRAY__PROXY__COLOCATE": "true",
                           "CLAWRAY__ENGINE__NUM_CPUS": "0.25", "CLAWRAY__PROXY__NUM_CPUS": "0.25"})
    serve.run(build_app(cfg), name="clawray-colo", route_prefix="/colo")
    try:
        client = openai.OpenAI(base_url=serve_app["base_url"] + "/colo/v1", api_key="unused", max_retries=0)
        sid = f"colo-{uuid.uuid4().hex[:8]}"
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           extra_headers={"X-Session-Id": sid})
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"},  # the reply as the client got it (item 4)
                                 {"role": "assistant", "content": r.choices[0].message.content or ""},
                                 {"role": "user", "content": "again"}],
            max_tokens=4, stream=True, extra_headers={"X-Session-Id": sid}) if c.choices)
        first, second = _turns(root, sid)
        assert first.response_text == r.choices[0].message.content and second.response_text == text
        assert first.next_state == [{"role": "user", "content": "again"}] and second.response_ids
        handle = serve.get_deployment_handle("PolicyEngine", app_name="clawray-colo")
        with pytest.raises(EngineRequestError) as e:
            handle.load_adapter.remote("policy-v0001").result(timeout_s=30)
        assert e.value.status == 409
    finally:
        serve.delete("clawray-colo")
