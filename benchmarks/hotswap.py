"""Time from "adapter published" to "first response served by it" (issue 3 "Speed"). A benchmark, not a
test. Target: <= 1 s on CPU.

The production path, end to end, on the real tiny model: the trainer's `publish_adapter` writes
`adapters/policy-vNNNN/` (peft weights + manifest, atomic rename) -> clock starts -> the trainer's
`notify_serving` asks the `PolicyEngine` deployment to load and activate it -> a client's chat request
through the Proxy -> clock stops when a reply arrives whose captured turn records that version.
Measured idle and while 4 streaming clients keep the engine busy.

Usage: python -m benchmarks.hotswap [--versions 5] [--quick] [--port N]
Writes benchmarks/out/hotswap.json and .md.
"""

from __future__ import annotations

import argparse
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

    from train.publish import notify_serving, publish_adapter

    torch.manual_seed(step)
    with torch.no_grad():  # new non-zero weights, so the version really changes the model
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    name, path = publish_adapter(model, cfg.storage_path() / "adapters", base_model=cfg.model_path(),
                                 lora=cfg.train.lora, step=step, skill_generation=0, metrics={})
    t0 = time.perf_counter()  # the folder is written (renamed into place)
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

    from cluster.runtime import deploy_serving
    from serve.sessions import SessionStore

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


def _markdown(res: dict[str, Any]) -> str:
    lines = [f"# Hot-swap: adapter published -> first response served by it ({res['meta']['cores']} cores, "
             f"load average at start {res['meta']['loadavg']:.1f})", "",
             "| condition | swaps | load+activate median (s) | published→first response median (s) | max (s) | "
             "requests until served (max) |", "|---|---|---|---|---|---|"]
    for cond in ("idle", "busy"):
        rows = res[cond]
        la = statistics.median(r["load_activate_s"] for r in rows)
        s = _stats([r["published_to_first_response_s"] for r in rows])
        lines.append(f"| {cond} | {len(rows)} | {la:.3f} | {s['median_s']:.3f} | {s['max_s']:.3f} | "
                     f"{max(r['requests_until_served'] for r in rows)} |")
    lines += ["", f"Failed background requests during swaps: {len(res['background_errors'])}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=5, help="swaps per condition (idle, busy)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 swaps per condition")
    ap.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
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

    from core.config import load_config

    storage = tempfile.mkdtemp(prefix="clawray-hotswap-")
    env = {**os.environ, "CLAWRAY__STORAGE_ROOT": storage, "CLAWRAY__PROXY__PORT": str(args.port)}
    cfg = load_config(REPO / "configs" / "local.yaml", env=env)
    load0 = os.getloadavg()[0]
    ray.init(address="local", num_cpus=8, namespace="clawray", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        res = _run(cfg, args.versions)
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
