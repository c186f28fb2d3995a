"""Versioned LoRA hot-swap under load: real peft adapters for the tiny model, swapped through the admin
routes while streaming requests run (official OpenAI SDK, threads)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.helpers import publish_adapters

pytestmark = pytest.mark.slow

ADMIN = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}


@pytest.fixture(scope="module")
def versions(serve_app):
    cfg = serve_app["config"]
    names = publish_adapters(cfg.model_path(), Path(cfg.storage_path()) / "adapters", 5)
    yield names
    httpx.post(f"{serve_app['base_url']}/admin/adapters/base/activate", headers=ADMIN, timeout=60)


def _admin(serve_app, method: str, path: str, headers=ADMIN) -> httpx.Response:
    return httpx.request(method, serve_app["base_url"] + path, headers=headers, timeout=120)


def test_admin_routes_refuse_without_key_unknown_and_unversioned_names(serve_app, versions):
    assert _admin(serve_app, "GET", "/admin/adapters", {}).status_code == 401
    assert _admin(serve_app, "GET", "/admin/adapters", {"X-Admin-Key": "wrong"}).status_code == 401
    assert _admin(serve_app, "POST", f"/admin/adapters/{versions[0]}/activate", {}).status_code == 401
    r = _admin(serve_app, "POST", "/admin/adapters/policy-v9999/load")
    assert r.status_code == 404 and "not published" in r.json()["error"]["message"]
    r = _admin(serve_app, "POST", "/admin/adapters/latest/activate")
    assert r.status_code == 400 and "policy-vNNNN" in r.json()["error"]["message"]
    assert _admin(serve_app, "DELETE", "/admin/adapters/policy-v9999").status_code == 404


def test_hot_swaps_under_streaming_load(serve_app, versions):
    """Zero failed requests; every turn ran on a version active at some point of its lifetime; versions
    beyond retention are unloaded; an adapter really changes the model."""
    from serve.sessions import SessionStore

    base_url = serve_app["base_url"] + "/v1"
    stop, done, failures = threading.Event(), [], []  # done: (session, t_start, t_end)

    def worker(i: int) -> None:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        while not stop.is_set():
            sid, t0 = f"hs-{i}-{uuid.uuid4().hex[:8]}", time.time()
            try:
                stream = client.chat.completions.create(
                    model="clawray-policy", messages=[{"role": "user", "content": f"count {i}"}], max_tokens=12,
                    stream=True, extra_headers={"X-Session-Id": sid})
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                assert isinstance(text, str)
                done.append((sid, t0, time.time()))
            except Exception as e:  # noqa: BLE001 - every failure is collected and fails the test below
                failures.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    # (version, earliest it may have become active, latest) in order; None = base before the first swap
    # Earlier tests (training windows) may have activated a version already: start from what is active.
    initial = _admin(serve_app, "GET", "/admin/adapters").json().get("active")
    swaps = [(initial, 0.0, time.time())]
    order = versions + [versions[2], versions[0]]  # v3 still loaded; v1 was unloaded: loaded again
    try:
        time.sleep(1.0)
        for name in order:
            t0 = time.time()
            r = _admin(serve_app, "POST", f"/admin/adapters/{name}/activate")
            assert r.status_code == 200, r.text
            swaps.append((name, t0, time.time()))
            time.sleep(0.7)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert failures == []
    assert len(done) >= 10

    def possible(t_start: float, t_end: float) -> set:
        """Versions whose activity window [activated earliest, next activated latest] meets the request's."""
        out = set()
        for i, (name, earliest, _) in enumerate(swaps):
            until = swaps[i + 1][2] if i + 1 < len(swaps) else float("inf")
            if earliest <= t_end and until >= t_start:
                out.add(name)
        return out

    store = SessionStore(Path(serve_app["config"].storage_path()) / "sessions" / "sessions.db")
    try:
        seen = []
        for sid, t0, t1 in done:
            (turn,) = store.turns(sid)
            assert turn.adapter_version in possible(t0, t1), (sid, turn.adapter_version)
            seen.append(turn.adapter_version)
    finally:
        store.close()
    assert len(set(seen)) >= 3  # requests really ran on several versions

    snap = _admin(serve_app, "GET", "/admin/adapters").json()
    retention = serve_app["config"].engine.adapter_retention
    assert snap["active"] == versions[0] and len(snap["loaded"]) <= retention
    assert versions[1] not in snap["loaded"] and versions[0] in snap["loaded"]  # oldest unused went
    ids = [m.id for m in openai.OpenAI(base_url=base_url, api_key="x").models.list().data]
    assert versions[1] not in ids and versions[0] in ids


def test_an_adapter_changes_the_logprobs(serve_app, versions):
    client = openai.OpenAI(base_url=serve_app["base_url"] + "/v1", api_key="x", max_retries=0)

    def first_logprob(model: str) -> float:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=1, temperature=0, logprobs=True)
        return r.choices[0].logprobs.content[0].logprob

    active = _admin(serve_app, "GET", "/admin/adapters").json()["active"]
    assert active is not None
    assert first_logprob(serve_app["config"].model.served_name) != pytest.approx(first_logprob(active), abs=1e-3)
