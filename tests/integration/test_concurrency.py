"""Many sessions at once through several Proxy replicas: no session ever mixes in turns of another.

The session fixture runs one Proxy replica. Redeploying the `clawray` app with more Proxy replicas would
give every deployment a new code version, i.e. restart the PolicyEngine (a second vLLM start), so
instead a second Serve app (`clawray-conc`, route `/conc`) puts two more Proxy replicas in front of the
SAME running PolicyEngine (a deployment handle, no second engine), with the SAME storage root (one
sessions DB) and the same PRM sinks: three replicas serve one set of sessions, as on a node with
several replicas. Each request picks its entry point at random, so a session's turns are recorded by
different replicas. The app is deleted afterwards (the system is as the fixture left it).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import ray

from tests.integration.helpers import wait_for
from tests.integration.loadgen import db_turns, in_replay

pytestmark = pytest.mark.slow

SESSIONS = 32
TURNS = 4
APP = "clawray-conc"


@pytest.fixture(scope="module")
def entry_points(serve_app):
    """Base URLs of the main app (1 Proxy replica) and the extra app (2 replicas, same engine + storage)."""
    from ray import serve

    from cluster.serve_app import build_proxy

    cfg = serve_app["config"].model_copy(deep=True)
    cfg.proxy.num_replicas = 2
    cfg.proxy.num_cpus = 0.25
    engine = serve.get_deployment_handle("PolicyEngine", app_name="clawray")
    sinks = [f"PRM-{i}" for i in range(cfg.rewards.pool_size)]
    serve.run(build_proxy(cfg, engine, sinks), name=APP, route_prefix="/conc")
    base = serve_app["base_url"]
    yield [base, base + "/conc"]
    serve.delete(APP)


def marker(sid: str, i: int) -> str:
    return f"[{sid}] turn {i}: what is {i} plus {len(sid)}?"


async def play(client: httpx.AsyncClient, bases: list[str], sid: str, rng: random.Random) -> list[str]:
    """One session of TURNS requests, each through a random entry point; the replicas that served it."""
    msgs: list[dict] = []
    replicas = []
    for i in range(TURNS):
        msgs.append({"role": "user", "content": marker(sid, i)})
        headers = {"X-Session-Id": sid, **({"X-Session-Done": "1"} if i == TURNS - 1 else {})}
        r = await client.post(rng.choice(bases) + "/v1/chat/completions", headers=headers, json={
            "model": "clawray-policy", "messages": msgs[-3:], "max_tokens": 4,
            "clawray_eval": {"type": "lowercase"}})
        assert r.status_code == 200, r.text
        replicas.append(r.headers["x-clawray-replica"])
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})
        await asyncio.sleep(rng.random() * 0.2)  # interleave the sessions' turns differently each run
    return replicas


async def play_all(bases: list[str], sids: list[str]) -> list[list[str]]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        return await asyncio.gather(*(play(client, bases, s, random.Random(s)) for s in sids))


def test_concurrent_sessions_through_three_replicas_never_mix(entry_points, serve_app):
    tag = f"conc{int(time.time()) % 100000}"
    sids = [f"{tag}-{i:02d}" for i in range(SESSIONS)]
    t0 = time.time()
    served = asyncio.run(play_all(entry_points, sids))
    elapsed = time.time() - t0
    replicas = Counter(r for rs in served for r in rs)
    mixed_sessions = sum(len(set(rs)) > 1 for rs in served)
    print(f"\n[concurrency] {SESSIONS} sessions x {TURNS} turns in {elapsed:.1f}s through "
          f"{len(replicas)} replicas {dict(replicas)}; {mixed_sessions} sessions served by >1 replica")
    assert len(replicas) == 3, "the three Proxy replicas should all have served"
    assert mixed_sessions > SESSIONS // 2

    turns = db_turns(Path(serve_app["config"].storage_path()) / "sessions" / "sessions.db", tag)
    by_session: dict[str, list] = {}
    for t in turns:
        by_session.setdefault(t.session_id, []).append(t)
    assert sorted(by_session) == sids
    for sid, ts in by_session.items():
        ts.sort(key=lambda t: t.turn_index)
        assert [t.turn_index for t in ts] == list(range(TURNS)), (sid, [t.turn_index for t in ts])
        for i, t in enumerate(ts):
            users = [m["content"] for m in t.messages if m.get("role") == "user"]
            assert users[-1] == marker(sid, i), (sid, i, users)  # this turn answers its own question
            assert all(u.startswith(f"[{sid}]") for u in users), (sid, i, users)  # no other session's
            nxt = [{"role": "user", "content": marker(sid, i + 1)}] if i + 1 < TURNS else None
            assert t.next_state == nxt, (sid, i, t.next_state)  # linked to its own successor

    # The outbox delivers every turn to the PRM; each becomes exactly one sample (sample_id == turn_id).
    ids = [t.turn_id for t in turns]
    replay = ray.get_actor("Replay", namespace="clawray")
    held = wait_for(lambda: s if len(s := in_replay(replay, ids)) == len(ids) else None, 120)
    assert held, f"{len(ids) - len(in_replay(replay, ids))} turns never became samples"
