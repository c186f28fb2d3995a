"""Time from "adapter published" to "first response served by it" (issue 3 "Speed"). A benchmark, not a
test. Target: <= 1 s on CPU.

The production path, end to end, on the real tiny model: the trainer's `publish_adapter` writes
`adapters/policy-vNNNN/` (peft weights + manifest, atomic rename) -> clock starts -> the trainer's
`notify_serving` asks the `PolicyEngine` deployment to load and activate it -> a client's chat request
through the Proxy -> clock stops when a reply arrives whose captured turn records that version.
Measured idle and while 4 streaming clients keep the engine busy, with adapters on a local folder and on
S3 (`storage_root: s3://...` on a moto_server, state in PostgreSQL; issue 13) in the same run.

Usage: python -m benchmarks.hotswap [--versions 5] [--quick] [--port N] [--storage local,s3]
Writes benchmarks/out/hotswap.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"


def _peft_model(model_path: str, lora):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=lora.target_modules))


def _served_by(store, sid: str) -> str | None:
    turns = store.turns(sid)
    return turns[-1].adapter_version if turns else None


def _one_swap(model, cfg, client, store, step: int) -> dict[str, Any]:
    """Publish one version, hot-swap it, poll with requests until one is served by it."""
    import torch

    from core.adapter_store import adapter_store
    from core.storage import StorageLayout
    from train.publish import notify_serving, publish_adapter

    torch.manual_seed(step)
    with torch.no_grad():  # new non-zero weights, so the version really changes the model
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    store_ = adapter_store(StorageLayout(cfg.storage_path(), cfg.blob_root()))  # a folder, or the bucket
    name, path = publish_adapter(model, store_, base_model=cfg.model_path(),
                                 lora=cfg.train.lora, step=step, skill_generation=0, metrics={})
    t0 = time.perf_counter()  # the folder is renamed into place / the version's record is created
    assert notify_serving(name, path), f"serving did not take {name}"
    t_active = time.perf_counter()
    tries = 0
    while True:
        sid, tries = f"hotswap-{uuid.uuid4().hex[:8]}", tries + 1
        client.chat.completions.create(model="clawray-policy", max_tokens=4, extra_headers={"X-Session-Id": sid},
                                       messages=[{"role": "user", "content": "which version are you?"}])
        t_reply = time.perf_counter()
        if _served_by(store, sid) == name:
            break
        if t_reply - t0 > 30:
            raise TimeoutError(f"{name} never served within 30 s")
    return {"version": name, "load_activate_s": t_active - t0, "published_to_first_response_s": t_reply - t0,
            "requests_until_served": tries}


def _background_load(base_url: str, stop: threading.Event, errors: list) -> list[threading.Thread]:
    import openai

    def loop(i: int) -> None:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        while not stop.is_set():
            try:
                for _ in client.chat.completions.create(
                        model="clawray-policy", max_tokens=24, stream=True,
                        messages=[{"role": "user", "content": f"keep busy {i}"}]):
                    pass
            except Exception as e:  # noqa: BLE001 - counted and reported: a swap must fail no request
                errors.append(repr(e))

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    return threads


def _run(cfg, versions: int) -> dict[str, Any]:
    import openai
    from ray import serve

    from cluster.runtime import deploy_serving
    from serve.sessions import SessionStore

    serve.shutdown()  # the previous storage's app (both are measured in one run)
    base = deploy_serving(cfg)
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "warm up"}])
    store = SessionStore(cfg.storage_path() / "sessions" / "sessions.db", cfg.state)
    model = _peft_model(cfg.model_path(), cfg.train.lora)
    idle = [_one_swap(model, cfg, client, store, step) for step in range(1, versions + 1)]
    stop, errors = threading.Event(), []
    threads = _background_load(base + "/v1", stop, errors)
    time.sleep(1.0)
    try:
        busy = [_one_swap(model, cfg, client, store, step) for step in range(versions + 1, 2 * versions + 1)]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    store.close()
    return {"idle": idle, "busy": busy, "background_errors": errors}


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(xs), "max_s": max(xs), "min_s": min(xs)}


STORAGE = {"local": "a local folder (rename into place)",
           "s3": "S3 (moto_server: upload, create-only record, serving copies to its cache)"}


def _markdown(res: dict[str, Any]) -> str:
    lines = [f"# Hot-swap: adapter published -> first response served by it ({res['meta']['cores']} cores, "
             f"load average at start {res['meta']['loadavg']:.1f})", "",
             "| adapters on | condition | swaps | load+activate median (s) | published→first response median (s) "
             "| max (s) | requests until served (max) |", "|---|---|---|---|---|---|---|"]
    for storage, run in res["storages"].items():
        for cond in ("idle", "busy"):
            rows = run[cond]
            la = statistics.median(r["load_activate_s"] for r in rows)
            s = _stats([r["published_to_first_response_s"] for r in rows])
            lines.append(f"| {STORAGE[storage]} | {cond} | {len(rows)} | {la:.3f} | {s['median_s']:.3f} | "
                         f"{s['max_s']:.3f} | {max(r['requests_until_served'] for r in rows)} |")
    errors = sum(len(run["background_errors"]) for run in res["storages"].values())
    lines += ["", f"Failed background requests during swaps: {errors}"]
    return "\n".join(lines) + "\n"


def _configs(storages: list[str], storage: str, port: int, stack) -> dict[str, Any]:
    """One config per storage: the local folder, and an s3:// root on a moto_server with its state in a
    private PostgreSQL (a remote storage root needs `state.dsn`), both started here (tests/servers.py)."""
    import boto3

    from core.config import load_config
    from tests.servers import S3_ENV, postgres, s3_server

    base = {**os.environ, "CLAWRAY__PROXY__PORT": str(port)}
    out = {}
    if "local" in storages:
        out["local"] = load_config(REPO / "configs" / "local.yaml", env={**base, "CLAWRAY__STORAGE_ROOT": storage})
    if "s3" in storages:
        for k, v in S3_ENV.items():
            os.environ.setdefault(k, v)
        endpoint = stack.enter_context(s3_server())
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint  # before Ray starts: every replica inherits it
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="clawray-hotswap")
        dsn = stack.enter_context(postgres(Path(storage)))
        out["s3"] = load_config(REPO / "configs" / "local.yaml", env={
            **base, "CLAWRAY__STORAGE_ROOT": f"s3://clawray-hotswap/{uuid.uuid4().hex[:8]}",
            "CLAWRAY__STATE__DSN": dsn})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=5, help="swaps per condition (idle, busy)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 swaps per condition")
    ap.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    ap.add_argument("--storage", default="local,s3", help="where adapters are published: local, s3 or both")
    args = ap.parse_args()
    if args.quick:
        args.versions = 2
    if args.port is None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            args.port = sock.getsockname()[1]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ray

    storage = tempfile.mkdtemp(prefix="clawray-hotswap-")
    load0 = os.getloadavg()[0]
    res: dict[str, Any] = {"storages": {}}
    with contextlib.ExitStack() as stack:
        cfgs = _configs(args.storage.split(","), storage, args.port, stack)
        ray.init(address="local", num_cpus=8, namespace="clawray", include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        try:
            for name, cfg in cfgs.items():
                res["storages"][name] = _run(cfg, args.versions)
        finally:
            from ray import serve

            serve.shutdown()
            ray.shutdown()
            shutil.rmtree(storage, ignore_errors=True)
    res["meta"] = {"cores": os.cpu_count(), "loadavg": load0, "time": time.time()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hotswap.json").write_text(json.dumps(res, indent=2))
    (OUT / "hotswap.md").write_text(_markdown(res))
    print(_markdown(res))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
