"""A scale model: what 10 / 1,000 / 100,000 daily users need, from measured per-unit costs (issue 19).

    python -m benchmarks.scale_model [--check] [--cpu-ms 12.0] [--gpu-tokens-s 6000] [--speed 60]

Per-unit costs, and where each comes from:
- Proxy CPU per request (ms, all server processes of the request path: Ray's HTTP proxy and the replica):
  measured by `--check` on this machine (the embedded default's co-located path in front of an instant
  engine, so the proxy is what is measured); otherwise `--cpu-ms` (default: the issue's measurement of the
  default path, 12-14 ms; the HAProxy fast path measured 3.3-4.0 ms).
- Stored bytes per turn (session store + completed-turns outbox) and per training sample (replay): the
  JSON clawray writes, built here from a Turn / Sample of the assumed prompt and response length (token ids
  dominate); `--check` compares the estimate with the bytes the storage root actually grew by.
- Judge calls per main turn: `rewards.votes` of the embedded default (3), for turns without a programmatic
  check (`--checked`: the fraction that has one).
- Training throughput on a GPU (tokens/s of one GRPO step, prompt + response tokens): ASSUMED (`--gpu-tokens-s`,
  default 6,000 for a 7B model with LoRA on one H100-class GPU), because no GPU is lent to this machine;
  benchmarks/trainer.py measures the CPU trainer.

Usage assumptions (flags): a user's agent sends `--requests` LLM requests a day over `--hours` active
hours with a peak hour `--peak` times the mean; `--main` of them are main turns (the rest side turns);
prompts of `--prompt` tokens, replies of `--response`; every main turn becomes a sample and the night's
window trains on all of them once; evidence and samples are kept `--retention` days.

Output per size: peak requests/s, proxy cores (target utilisation 60%), judge calls/s at peak, storage
growth per day and at retention, training tokens and GPU-hours per night, GPUs for an 8 h window, and the
first bottleneck against one reference node (`--node-cores` 96, `--node-gpus` 8, `--node-disk-tb` 2 of
state) and a judge endpoint's rate limit (`--judge-rps` 50). Writes benchmarks/out/scale_model.json.

`--check`: a simulated load of the smallest size on this machine, compressed in time (`--speed`: 60 means
one simulated hour per real minute), through the real Proxy (co-located default, instant engine) for 20 s;
prints the model's per-request CPU and bytes against what the processes used and the disk grew by.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out" / "scale_model.json"
SIZES = (10, 1_000, 100_000)
UTIL = 0.6  # target CPU utilisation of proxy replicas
WINDOW_H = 8.0  # the night's training window


@dataclass
class Usage:
    requests: int = 300  # LLM requests per user per day (an agent makes several per user message)
    hours: float = 8.0
    peak: float = 3.0
    main: float = 0.8
    prompt: int = 12_000
    response: int = 400
    checked: float = 0.0  # fraction of main turns with a programmatic check (no judge call)
    retention: float = 30.0


@dataclass
class Costs:
    cpu_ms: float  # server CPU per request
    turn_bytes: float  # per stored turn (session store + outbox)
    sample_bytes: float  # per replay sample
    votes: int
    gpu_tokens_s: float


def stored_bytes(prompt: int, response: int, message_chars: int, token_id: int = 151_000,
                 reply_chars: int | None = None) -> tuple[int, int]:
    """JSON bytes of one Turn and one Sample of that shape, as the stores write them (`token_id`: a
    typical id; a 150k vocabulary's take 6 digits)."""
    from core.contracts import Sample, Turn

    msgs = [{"role": "system", "content": "s" * (message_chars // 4)}, {"role": "user", "content": "u" * (message_chars * 3 // 4)}]
    turn = Turn(session_id="s" * 24, turn_index=3, messages=msgs, prompt_ids=[token_id] * prompt,
                response_ids=[token_id] * response, response_logprobs=[-0.123456789] * response,
                response_text="r" * (4 * response if reply_chars is None else reply_chars))
    sample = Sample.from_turn(turn, 1.0, True)
    return len(turn.model_dump_json()), len(sample.model_dump_json())


def model(users: int, u: Usage, c: Costs, node_cores: int, node_gpus: int, judge_rps: float,
          node_disk_tb: float) -> dict[str, Any]:
    day = users * u.requests
    peak_rps = day / (u.hours * 3600) * u.peak
    cores = peak_rps * c.cpu_ms / 1000 / UTIL
    judge = peak_rps * u.main * (1 - u.checked) * c.votes
    mains = day * u.main
    growth = day * c.turn_bytes + mains * c.sample_bytes
    tokens = mains * (u.prompt + u.response)
    gpu_h = tokens / c.gpu_tokens_s / 3600
    gpus = gpu_h / WINDOW_H
    load = {"proxy CPU": cores / node_cores, "judge endpoint": judge / judge_rps, "training GPUs": gpus / node_gpus,
            "state disk": growth * u.retention / (node_disk_tb * 1e12)}
    first = max(load, key=load.get)
    return {"users": users, "peak_rps": peak_rps, "proxy_cores": cores, "proxy_replicas": max(1, math.ceil(cores)),
            "judge_calls_s": judge, "storage_gb_day": growth / 1e9, "storage_gb_retained": growth * u.retention / 1e9,
            "train_tokens_night": tokens, "gpu_hours_night": gpu_h, "gpus_for_window": gpus,
            "load_vs_node": load, "first_bottleneck": first if load[first] >= 1 else f"none (largest: {first})"}


def _stored_turns(root: Path) -> tuple[int, float]:
    """(turns, mean JSON bytes of one) in the session store under `root`."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{root / 'sessions' / 'sessions.db'}?mode=ro", uri=True)) as c:
        n, mean = c.execute("SELECT count(*), avg(length(payload)) FROM turns").fetchone()
    return int(n), float(mean or 0.0)


def check(u: Usage, speed: float, seconds: float = 20.0) -> dict[str, Any]:
    """The smallest size's peak hour, compressed `speed` times, through the real Proxy (module docstring)."""
    import ray
    from ray import serve

    from benchmarks.proxy_overhead import (
        KEY_ENV,
        MESSAGES,
        FakeEngineImpl,
        _cpu,
        _deploy,
        _free_port,
        _processes,
    )
    from core.config import load_config

    rate = SIZES[0] * u.requests / (u.hours * 3600) * u.peak * speed
    os.environ.setdefault(KEY_ENV, f"sk-scale-{os.getpid()}")
    port = _free_port()
    cfg = load_config(REPO / "configs" / "local.yaml")
    storage = Path(tempfile.mkdtemp(prefix="clawray-scale-"))
    cfg = cfg.model_copy(update={"storage_root": str(storage), "proxy": cfg.proxy.model_copy(
        update={"api_key_env": KEY_ENV, "admin_key_env": "CLAWRAY_BENCH_NO_ADMIN"})})
    ray.init(address="local", num_cpus=8, namespace="clawray-scale", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        from benchmarks.proxy_overhead import FakeEngine

        url = _deploy(FakeEngine.bind(), cfg, port, colocate=FakeEngineImpl)["colocated"]
        body = {"model": "clawray-policy", "messages": MESSAGES, "max_tokens": 8}
        asyncio.run(_open_loop(url, body, 5.0, 1.0))  # warm-up
        time.sleep(2.0)
        procs = _processes()
        cpu0 = _cpu(procs)
        sent = asyncio.run(_open_loop(url, body, rate, seconds))
        cpu1 = _cpu(procs)
        time.sleep(2.0)  # the last turns are written
        turns, turn_bytes = _stored_turns(storage)
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    cpu_s = (cpu1["http"] - cpu0["http"]) + (cpu1["colo"] - cpu0["colo"])
    chars = sum(len(m["content"]) for m in MESSAGES)
    # the fake engine's capture: ids 0..95 and 0..15 (two digits on average), logprobs -1.0, a 22-char reply
    est_turn, _ = stored_bytes(FakeEngineImpl.PROMPT_LEN, FakeEngineImpl.RESPONSE_LEN, chars, token_id=50,
                               reply_chars=22)
    return {"rate_rps": rate, "seconds": seconds, "sent_ok": sent, "cpu_ms_per_request": 1000 * cpu_s / max(sent, 1),
            "turns_stored": turns, "bytes_per_turn_measured": turn_bytes, "bytes_per_turn_model": est_turn}


async def _open_loop(url: str, body: dict, rate: float, seconds: float) -> int:
    """POST `body` at a fixed `rate` (open loop: arrivals do not wait for replies); 2xx replies counted."""
    import aiohttp

    from benchmarks.proxy_overhead import KEY_ENV

    ok = 0
    headers = {"Authorization": f"Bearer {os.environ[KEY_ENV]}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async def one(i: int) -> None:
            nonlocal ok
            async with http.post(url, json=body, headers={**headers, "X-Session-Id": f"scale-{i}"}) as r:
                await r.read()
                ok += r.status == 200

        tasks, t0, n = [], time.perf_counter(), int(rate * seconds)
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    u0 = Usage()
    for f, v in asdict(u0).items():
        ap.add_argument(f"--{f}", type=type(v), default=v)
    ap.add_argument("--cpu-ms", type=float, default=12.0)
    ap.add_argument("--gpu-tokens-s", type=float, default=6000.0)
    ap.add_argument("--node-cores", type=int, default=96)
    ap.add_argument("--node-gpus", type=int, default=8)
    ap.add_argument("--judge-rps", type=float, default=50.0)
    ap.add_argument("--node-disk-tb", type=float, default=2.0)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--speed", type=float, default=60.0)
    a = ap.parse_args(argv)
    u = Usage(**{f: getattr(a, f) for f in asdict(u0)})
    measured = check(u, a.speed) if a.check else None
    from core.config import RewardsConfig

    turn_b, sample_b = stored_bytes(u.prompt, u.response, u.prompt * 4)
    cpu_ms = measured["cpu_ms_per_request"] if measured else a.cpu_ms
    costs = Costs(cpu_ms, turn_b, sample_b, RewardsConfig().votes, a.gpu_tokens_s)
    rows = [model(n, u, costs, a.node_cores, a.node_gpus, a.judge_rps, a.node_disk_tb) for n in SIZES]
    _report(rows, u, costs, measured, cpu_source="measured by --check" if measured else "--cpu-ms")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"usage": asdict(u), "costs": asdict(costs), "rows": rows, "check": measured,
                               "time": time.time()}, indent=2))
    return 0


def _report(rows, u: Usage, c: Costs, measured, cpu_source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    con.print(f"usage: {asdict(u)}")
    con.print(f"costs: {c.cpu_ms:.2f} CPU ms/request ({cpu_source}), {c.turn_bytes / 1e3:.0f} kB/turn, "
              f"{c.sample_bytes / 1e3:.0f} kB/sample, {c.votes} judge votes, {c.gpu_tokens_s:.0f} GPU tokens/s (assumed)")
    t = Table(title="scale model (benchmarks/scale_model.py)")
    for col in ("daily users", "peak req/s", "proxy cores", "judge calls/s", "storage GB/day", "GB retained",
                "GPU-h/night", "GPUs (8 h)", "first bottleneck"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['users']:,}", f"{r['peak_rps']:.2f}", f"{r['proxy_cores']:.2f}", f"{r['judge_calls_s']:.2f}",
                  f"{r['storage_gb_day']:.2f}", f"{r['storage_gb_retained']:.1f}", f"{r['gpu_hours_night']:.2f}",
                  f"{r['gpus_for_window']:.2f}", r["first_bottleneck"])
    con.print(t)
    if measured:
        con.print(f"check at {SIZES[0]} users (x{measured['rate_rps'] / rows[0]['peak_rps']:.0f} time compression, "
                  f"{measured['rate_rps']:.1f} req/s for {measured['seconds']:.0f} s, {measured['sent_ok']} ok): "
                  f"{measured['cpu_ms_per_request']:.2f} CPU ms/request measured (HTTP proxy + replica); "
                  f"{measured['turns_stored']} turns stored, {measured['bytes_per_turn_measured']:.0f} bytes of JSON "
                  f"each vs {measured['bytes_per_turn_model']:.0f} modelled for that shape")


if __name__ == "__main__":
    raise SystemExit(main())
