"""Long-term memory through the real system: Proxy -> PolicyEngine (vLLM) -> outbox -> PRM -> Memory actor.

A fact stated in one session is injected into a later session of the same user and workspace (and is in
the prompt the engine rendered, recorded on the turn), never into another user's or another workspace's,
whatever ids they send; forgetting the user removes it from retrieval at the very next request.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.conftest import ADMIN_HEADERS
from tests.integration.helpers import session_turns, wait_for

FACT = "kumquat-7"


def _chat(client, user: str, workspace: str, session: str, text: str, *, done: bool = False,
          scope: str | None = None):
    headers = {"X-Session-Id": session, "X-User-Id": user, "X-Workspace-Id": workspace}
    if done:
        headers["X-Session-Done"] = "true"
    if scope:
        headers["X-Memory-Scope"] = scope
    return client.chat.completions.create(model="clawray-policy", max_tokens=4, extra_headers=headers,
                                          messages=[{"role": "user", "content": text}])


def _turn(serve_app, session: str):
    (turn,) = session_turns(serve_app["config"].storage_path(), session)
    return turn


def _system(turn) -> str:
    first = turn.messages[0]
    return first["content"] if first["role"] == "system" else ""


def _units(base: str, user: str) -> list[dict]:
    r = httpx.get(f"{base}/admin/memory/units", params={"user": user}, headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def remembered(serve_app, openai_client):
    """alice states the fact in session 1 and ends it; wait until the Memory actor has stored it."""
    tag = uuid.uuid4().hex[:8]
    alice = f"alice-{tag}"
    _chat(openai_client, alice, "proj", f"s1-{tag}", f"Remember that the deploy target is {FACT}.", done=True)
    units = wait_for(lambda: [u for u in _units(serve_app["base_url"], alice) if FACT in u["content"]], 180)
    assert units, "the Memory actor did not ingest the ended session"
    return {"tag": tag, "alice": alice, "unit": units[0]}


def test_a_fact_from_one_session_is_injected_in_a_later_session_of_the_same_user_and_workspace(
        serve_app, openai_client, remembered):
    session = f"s2-{remembered['tag']}"
    _chat(openai_client, remembered["alice"], "proj", session, "Where do we deploy to?")
    turn = _turn(serve_app, session)
    assert remembered["unit"]["unit_id"] in turn.memories
    assert FACT in _system(turn) and "## Memory" in _system(turn)  # what the engine rendered


@pytest.mark.parametrize("who", ["other-user", "other-workspace", "adversarial-ids", "session-scope"])
def test_the_fact_never_reaches_another_user_or_workspace(serve_app, openai_client, remembered, who):
    tag, alice = remembered["tag"], remembered["alice"]
    user, workspace, scope = {
        "other-user": (f"mallory-{tag}", "proj", None),
        "other-workspace": (alice, "other-proj", None),
        # alice's ids re-cut ("alice-1234567" + "8/proj" spells alice's tenant "alice-12345678/proj" with
        # one slash moved) and alice's own session id reused by someone else
        "adversarial-ids": (alice[:-1], alice[-1] + "/proj", None),
        "session-scope": (alice, "proj", "session"),  # X-Memory-Scope narrows alice to this session
    }[who]
    session = f"s1-{tag}" if who == "adversarial-ids" else f"{who}-{tag}"
    _chat(openai_client, user, workspace, session, f"Where do we deploy to? Is it {FACT[:4]}?", scope=scope)
    turn = [t for t in session_turns(serve_app["config"].storage_path(), session)
            if t.tenant == f"{user}/{workspace}"][-1]
    assert turn.memories == [] and FACT not in _system(turn)


def test_a_user_id_with_a_slash_is_refused(serve_app):
    r = httpx.post(serve_app["base_url"] + "/v1/chat/completions", timeout=30,
                   headers={"X-User-Id": "alice/proj"},
                   json={"model": "clawray-policy", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "X-User-Id" in r.json()["error"]["message"]


def test_the_admin_memory_routes(serve_app, remembered):
    base, alice, unit = serve_app["base_url"], remembered["alice"], remembered["unit"]
    r = httpx.get(f"{base}/admin/memory/units/{unit['unit_id']}", headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 200 and r.json()["unit"]["content"] == unit["content"]
    r = httpx.post(f"{base}/admin/memory/search", headers=ADMIN_HEADERS, timeout=60,
                   json={"query": "Where do we deploy to?", "user": alice, "workspace": "proj"})
    assert r.status_code == 200 and unit["unit_id"] in [u["unit_id"] for u in r.json()]
    r = httpx.post(f"{base}/admin/memory/search", headers=ADMIN_HEADERS, timeout=60,
                   json={"query": "Where do we deploy to?", "user": f"mallory-{remembered['tag']}", "workspace": "proj"})
    assert r.status_code == 200 and r.json() == []
    r = httpx.get(f"{base}/admin/memory/export", params={"user": alice}, headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 200 and unit["unit_id"] in r.text and r.text.endswith("\n")
    r = httpx.get(f"{base}/admin/memory/stats", headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 200 and r.json()["units"] >= 1
    r = httpx.get(f"{base}/admin/memory/units", params={"session": "x"}, headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 400 and "workspace" in r.json()["error"]["message"]
    r = httpx.delete(f"{base}/admin/memory/units/nope", headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 404


def test_forgetting_removes_the_fact_from_retrieval_at_once(serve_app, openai_client, remembered):
    """The user sees their memory; the operator forgets the workspace and the very next request of that
    user gets nothing from it; the user then forgets themself through their own route."""
    base, alice, tag = serve_app["base_url"], remembered["alice"], remembered["tag"]
    own = {"X-User-Id": alice, "X-Workspace-Id": "proj"}
    r = httpx.get(f"{base}/v1/memory", headers=own, timeout=30)
    assert r.status_code == 200 and FACT in " ".join(u["content"] for u in r.json())
    assert httpx.get(f"{base}/v1/memory", headers={"X-User-Id": f"mallory-{tag}"}, timeout=30).json() == []
    r = httpx.post(f"{base}/admin/memory/forget", json={"user": alice, "workspace": "proj"},
                   headers=ADMIN_HEADERS, timeout=30)
    assert r.status_code == 200 and r.json()["deleted"] >= 1
    session = f"s3-{tag}"
    _chat(openai_client, alice, "proj", session, "Where do we deploy to?")
    turn = _turn(serve_app, session)
    assert turn.memories == [] and FACT not in _system(turn)
    assert not [u for u in _units(base, alice) if u["workspace"] == "proj"]
    r = httpx.delete(f"{base}/v1/memory", params={"scope": "user"}, headers=own, timeout=30)
    assert r.status_code == 200 and httpx.get(f"{base}/v1/memory", headers=own, timeout=30).json() == []
    r = httpx.get(f"{base}/admin/memory/units", params={"user": alice}, timeout=30)
    assert r.status_code in (401, 403)  # admin routes need the admin key
