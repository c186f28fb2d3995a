"""A multi-host clawray on one machine, with its state in PostgreSQL (and its blobs in S3 when given).

Run as a subprocess by tests/integration/test_multihost_state.py (it needs a Ray cluster of its own):
    python -m tests.integration.multihost_driver --dsn postgresql://... --out result.json [--s3 URL]

A `ray.cluster_utils.Cluster` of two nodes (`host_a` = head, `host_b`), each a raylet of its own, the
whole system started on it with two Proxy replicas spread over the nodes (`proxy.max_replicas_per_node:
1`; Serve's ingress on the head only: both nodes share this machine's ports). Simulated users
(tests/integration/loadgen.py: OpenAI SDK, sessions, streams) keep sending while we
1. kill -9 the Proxy replica serving an open stream (mid-stream), then
2. kill -9 the `Replay` actor,
and after the load stops we compare counts: every request the client saw succeed has exactly one turn,
every turn of our sessions is exactly one sample in `Replay` (nothing lost, nothing duplicated). The
summary (and any violation) goes to `--out` as JSON; the exit code is 0 only when every check held.
"""

from __future__ import annotations

import os

os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: every process of the cluster must agree

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402

from core.config import REPO_ROOT, load_config  # noqa: E402
from tests.servers import free_port, unique_namespace  # noqa: E402

RECOVER_S = 60.0
BUCKET = "clawray-mh"


def _config(dsn: str, root: Path, address: str, s3: str | None):
    env = dict(os.environ)
    env.update({
        "CLAWRAY__STORAGE_ROOT": f"s3://{BUCKET}/{root.parent.name}" if s3 else str(root),
        "CLAWRAY__RAY__ADDRESS": address,
        "CLAWRAY__STATE__DSN": dsn,
        "CLAWRAY__STATE__NAMESPACE": unique_namespace("mh"),
        "CLAWRAY__PROXY__PORT": str(free_port()),
        "CLAWRAY__PROXY__COLOCATE": "false",
        "CLAWRAY__PROXY__NUM_REPLICAS": "2",
        "CLAWRAY__PROXY__MAX_REPLICAS_PER_NODE": "1",
        "CLAWRAY__PROXY__INGRESS": "head_only",
        "CLAWRAY__PROXY__SESSION_IDLE_TIMEOUT_S": "3600",
        "CLAWRAY__SCHEDULER__SLEEP_START": "", "CLAWRAY__SCHEDULER__SLEEP_END": "",
        "CLAWRAY__SCHEDULER__IDLE_MINUTES": "", "CLAWRAY__SCHEDULER__POLL_S": "1",
    })
    return load_config(REPO_ROOT / "configs" / "local.yaml", env=env)


def _actors(class_part: str) -> list[dict]:
    import ray

    return [a for a in ray._private.state.actors(actor_state_name="ALIVE").values()
            if class_part in a["ActorClassName"] and a["Pid"]]


def _proxy_replicas() -> list[dict]:
    return _actors("ServeReplica:clawray:Proxy")


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _healthy(base: str) -> bool:
    import ray

    try:
        ok = httpx.get(base + "/healthz", timeout=5).status_code == 200
        replay = ray.get_actor("Replay", namespace="clawray")
        ray.get(replay.stats.remote(), timeout=5)
        return ok and len(_proxy_replicas()) == 2
    except (httpx.HTTPError, ray.exceptions.RayError, ValueError):
        return False


def kill_replica_mid_stream(base: str) -> dict:
    """Open a long stream, read its first chunk, kill -9 the replica serving it (by its id header)."""
    pids = {a["Name"]: a["Pid"] for a in _proxy_replicas()}
    with httpx.Client(timeout=60) as c, c.stream(
            "POST", base + "/v1/chat/completions",
            headers={"X-Session-Id": "mh-victim-stream", "X-User-Id": "victim"},
            json={"model": "clawray-policy", "stream": True, "max_tokens": 400, "temperature": 1.0,
                  "messages": [{"role": "user", "content": "Tell me a long story."}]}) as r:
        replica = r.headers["x-clawray-replica"]
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        (name, pid), = [(n, p) for n, p in pids.items() if n.endswith(replica)]
        t0 = time.time()
        os.kill(pid, signal.SIGKILL)
        rest = []
        try:
            rest = list(lines)
            broke = False
        except httpx.HTTPError:
            broke = True
    return {"replica": name, "pid": pid, "t0": t0, "first_chunk": first[:60],
            "stream_ended_cleanly": not broke and any("[DONE]" in x for x in rest)}


def kill_replay() -> dict:
    (a,) = _actors("Replay")
    os.kill(a["Pid"], signal.SIGKILL)
    return {"pid": a["Pid"], "t0": time.time()}


def pg_samples(cfg, ids: list[str]) -> int:
    """Samples of `ids` in the PostgreSQL replay schema itself: proves Replay's state is in PostgreSQL."""
    import psycopg

    with psycopg.connect(cfg.state.connection_string()) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {cfg.state.namespace}_replay.samples WHERE sample_id = ANY(%s)",
                            (ids,)).fetchone()[0]


def publish_and_serve_an_adapter(cfg, base: str) -> dict:
    """Publish one LoRA version as training does (to the bucket when the root is s3://), have the engine
    load and activate it, and answer through the policy alias with it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from core.adapter_store import adapter_store
    from core.storage import StorageLayout
    from train.publish import notify_serving, publish_adapter

    lora = cfg.train.lora.model_copy(update={"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]})
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(cfg.model_path(), torch_dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    store = adapter_store(StorageLayout(cfg.storage_path(), cfg.blob_root()))
    name, where = publish_adapter(model, store, base_model=cfg.model_path(), lora=lora, step=1,
                                  skill_generation=0, metrics={})
    served = notify_serving(name, where)
    r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
        "model": cfg.model.policy_alias, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Session-Id": "mh-adapter", "X-Turn-Type": "side"})
    active = httpx.get(base + "/v1/models", timeout=30).json()
    return {"adapter": name, "adapter_uri": str(where), "adapter_served": served and r.status_code == 200,
            "models": [m["id"] for m in active.get("data", [])]}


def check(load, store, replay, windows: list[tuple[float, float]]) -> dict:
    """Every ok request has one turn; every turn is exactly one sample; counts side by side."""
    from tests.integration.loadgen import in_replay

    reqs = load.snapshot()
    turns = [t for t in store.turns() if t.session_id.startswith(load.tag)]
    ids = [t.turn_id for t in turns]
    held = _wait(lambda: s if len(s := in_replay(replay(), ids)) >= len(ids) else None, 180,
                 "every turn to become a sample")
    ok_texts = Counter((r.session, r.text) for r in reqs if r.ok)
    db_texts = Counter((t.session_id, t.response_text) for t in turns)
    by_session: dict[str, list[int]] = {}
    for t in turns:
        by_session.setdefault(t.session_id, []).append(t.turn_index)
    summary = {
        "sent": len(reqs), "ok": sum(r.ok for r in reqs), "failed": sum(not r.ok for r in reqs),
        "replicas_seen": sorted({r.replica for r in reqs if r.replica}),
        "turns": len(turns), "distinct_turn_ids": len(set(ids)), "samples": len(held),
        "unmatched_ok_replies": sum((ok_texts - db_texts).values()),
        "bad_session_indexes": {s: ix for s, ix in by_session.items() if sorted(ix) != list(range(len(ix)))},
        "failed_outside_outage": [r.session for r in reqs if not r.ok and not any(
            a <= r.t1 and r.t0 <= b for a, b in windows)],
    }
    summary["ok_all"] = (summary["unmatched_ok_replies"] == 0 and summary["turns"] == summary["samples"]
                         == summary["distinct_turn_ids"] and not summary["bad_session_indexes"]
                         and not summary["failed_outside_outage"] and summary["ok"] > 0)
    return summary


def run(dsn: str, s3: str | None, workdir: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from cluster.system import start_system
    from serve.sessions import DB_FILE, SessionStore
    from tests.integration.loadgen import Load

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 6, "resources": {"host_a": 1}, "include_dashboard": False})
    cluster.add_node(num_cpus=4, resources={"host_b": 1})
    cluster.wait_for_nodes()
    result: dict = {}
    try:
        cfg = _config(dsn, workdir / "storage", cluster.address, s3)
        system = start_system(cfg)
        base = system.base_url
        replicas = _wait(lambda: len(_proxy_replicas()) == 2 and _proxy_replicas(), 120, "two Proxy replicas")
        nodes = {a["Address"]["NodeID"] for a in replicas}
        result["proxy_nodes"] = len(nodes)
        store = SessionStore(workdir / "unused" / DB_FILE, cfg.state)

        def replay():
            return ray.get_actor("Replay", namespace="clawray")

        load = Load(base, tag="mh", users=4, stream_users=2, rounds_per_session=3, max_tokens=8).start()
        _wait(lambda: sum(r.ok for r in load.snapshot()) >= 8, 180, "the first answers")
        windows = []
        victim = kill_replica_mid_stream(base)
        _wait(lambda: _healthy(base), RECOVER_S, "a new Proxy replica")
        windows.append((victim["t0"], time.time()))
        result["replica_kill"] = victim
        _wait(lambda: sum(r.ok for r in load.snapshot() if r.t0 > windows[-1][1]) >= 4, 120,
              "answers after the replica came back")
        victim = kill_replay()
        _wait(lambda: _healthy(base), RECOVER_S, "a new Replay")
        result["replay_kill"] = victim
        _wait(lambda: sum(r.ok for r in load.snapshot() if r.t0 > time.time() - 30) >= 4, 120,
              "answers after Replay came back")
        load.stop()
        result.update(check(load, store, replay, windows))
        turn_ids = [t.turn_id for t in store.turns() if t.session_id.startswith(load.tag)]
        result["samples_in_postgresql"] = pg_samples(cfg, turn_ids)
        result["ok_all"] = result["ok_all"] and result["samples_in_postgresql"] == len(turn_ids)
        result.update(publish_and_serve_an_adapter(cfg, base))
        result["ok_all"] = result["ok_all"] and result["adapter_served"] and (
            s3 is None or result["adapter_uri"].startswith("s3://"))
        store.close()
    finally:
        try:
            from ray import serve

            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--s3", default=None, help="S3 endpoint URL: blobs in a bucket there")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.s3:
        import boto3

        os.environ["AWS_ENDPOINT_URL_S3"] = args.s3  # every process of the cluster inherits it
        boto3.client("s3", endpoint_url=args.s3).create_bucket(Bucket=BUCKET)
    with tempfile.TemporaryDirectory(prefix="clawray-mh-") as tmp:
        try:
            result = run(args.dsn, args.s3, Path(tmp))
        except Exception:  # noqa: BLE001 - the test reads the traceback from the JSON
            result = {"ok_all": False, "error": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("ok_all") else 1


if __name__ == "__main__":
    sys.exit(main())
