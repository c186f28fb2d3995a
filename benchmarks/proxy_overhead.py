"""What the clawray Proxy adds to a request, measured (issue 3 "Speed"). A benchmark, not a test.

Three HTTP paths to the same engine deployment, all through Ray Serve's HTTP proxy, driven by one aiohttp
client at concurrency 1, 16 and 64 (non-streaming OpenAI chat completions):

- direct: the engine deployment itself serves `/v1/chat/completions` (no ingress in front of it);
- floor:  an empty pass-through FastAPI ingress that only forwards the body through a deployment handle;
- proxy:  clawray's `Proxy` (auth, session meta, skill hook, capture -> Turn -> SQLite session store,
          outbox dispatcher) forwarding through the same kind of handle.

and two engines: an instant fake (`FakeEngine`: returns a canned reply and a fake token capture, so the
proxy is what is measured) and the real tiny model on vLLM (`--real`, on by default; `--no-real` skips).

Usage: python -m benchmarks.proxy_overhead [--duration 3] [--no-real] [--ha-proxy]
Writes benchmarks/out/proxy_overhead{,-haproxy}.json and .md and prints a rich table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
CONCURRENCY = (1, 16, 64)
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Plan my day: three meetings and a dentist appointment."},
    {"role": "assistant", "content": "Meetings at 9, 11 and 2; dentist at 4."},
    {"role": "user", "content": "Move the dentist to the morning."},
]


# ---- the instant engine ------------------------------------------------------------------------------

class FakeEngineImpl:
    """Implements the engine methods the Proxy calls; replies instantly with a canned body + capture."""

    PROMPT_LEN, RESPONSE_LEN = 96, 16

    def __init__(self) -> None:
        self._body = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Dentist moved to 8:30."}}],
            "usage": {"prompt_tokens": self.PROMPT_LEN, "completion_tokens": self.RESPONSE_LEN,
                      "total_tokens": self.PROMPT_LEN + self.RESPONSE_LEN},
        }
        self._chunks = [
            'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Dentist"}}]}\n\n',
            'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" moved."},'
            '"finish_reason":"stop"}]}\n\n',
            "data: [DONE]\n\n",
        ]

    def _capture(self):
        from serve.capture import Capture, ChoiceCapture

        cap = Capture(key="fake", prompt_ids=list(range(self.PROMPT_LEN)), done=True)
        cap.choices[0] = ChoiceCapture(index=0, token_ids=list(range(self.RESPONSE_LEN)),
                                       logprobs=[-1.0] * self.RESPONSE_LEN, text="Dentist moved to 8:30.",
                                       finish_reason="stop")
        return cap

    async def chat(self, body: dict[str, Any]):
        from serve.protocol import Reply

        return Reply(self._body, self._capture(), body["messages"])

    messages = chat

    async def chat_stream(self, body: dict[str, Any]):
        from serve.protocol import Reply

        for c in self._chunks:
            yield c
        yield Reply({}, self._capture(), body["messages"])

    messages_stream = chat_stream

    async def models(self) -> dict[str, Any]:
        return {"base": "fake", "alias": "clawray-policy", "active": None, "loaded": [], "max_model_len": 512}


fake_app = FastAPI()


@serve.deployment(name="Engine", max_ongoing_requests=1024)
@serve.ingress(fake_app)
class FakeEngine(FakeEngineImpl):
    @fake_app.post("/v1/chat/completions")
    async def http_chat(self, request: Request):
        return JSONResponse((await self.chat(await request.json())).body)


# ---- the real engine, also reachable over HTTP directly -----------------------------------------------

real_app = FastAPI()


def _real_engine_cls():
    from serve.engine import PolicyEngineImpl

    @serve.deployment(name="Engine", max_ongoing_requests=256)
    @serve.ingress(real_app)
    class RealEngine(PolicyEngineImpl):
        async def __init__(self, *args):
            PolicyEngineImpl.__init__(self, *args)
            await self.start()

        @real_app.post("/v1/chat/completions")
        async def http_chat(self, request: Request):
            return JSONResponse((await self.chat(await request.json())).body)

    return RealEngine


# ---- the floor: an empty pass-through ingress ----------------------------------------------------------

floor_app = FastAPI()


@serve.deployment(name="Floor", max_ongoing_requests=1024)
@serve.ingress(floor_app)
class PassThrough:
    def __init__(self, engine):
        self.engine = engine

    @floor_app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        reply = await self.engine.chat.remote(await request.json())
        return JSONResponse(reply.body)


# ---- load ----------------------------------------------------------------------------------------------

async def _load(url: str, c: int, duration: float, payload: dict, warmup: float = 0.5) -> dict[str, Any]:
    """`c` workers POST `payload` back to back for `duration` s; latencies of 2xx replies after warmup."""
    import aiohttp

    data = json.dumps(payload).encode()
    lat: list[float] = []
    errors = 0
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + duration
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as http:

        async def worker(i: int) -> None:
            nonlocal errors
            headers = {"Content-Type": "application/json", "X-Session-Id": f"bench-{c}-{i}-{t_start}"}
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                async with http.post(url, data=data, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
                t1 = time.perf_counter()
                if t0 >= t_measure:
                    if ok:
                        lat.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(i) for i in range(c)))
    lat.sort()
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else [lat[0]] * 99
    return {"c": c, "n": len(lat), "errors": errors, "rps": len(lat) / duration,
            "p50_ms": 1000 * q[49], "p99_ms": 1000 * q[98]}


def _deploy(engine_dep, storage: str, port: int) -> dict[str, str]:
    """Engine app (direct), floor app and clawray Proxy app, the latter two with a handle to the engine."""
    from core.config import ProxyConfig, SkillsConfig
    from serve.proxy import PROXY_REPLICA_ENV, Proxy

    serve.run(engine_dep, name="bench-engine", route_prefix="/direct")
    engine = serve.get_deployment_handle("Engine", app_name="bench-engine")
    serve.run(PassThrough.bind(engine), name="bench-floor", route_prefix="/floor")
    proxy_cfg = ProxyConfig(api_key_env=None, admin_key_env="CLAWRAY_BENCH_ADMIN_UNSET").model_dump()
    opts = {"num_cpus": 0.5, "runtime_env": {"env_vars": dict(PROXY_REPLICA_ENV)}}
    serve.run(Proxy.options(ray_actor_options=opts).bind(
        engine, proxy_cfg, SkillsConfig().model_dump(), storage), name="bench-proxy", route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    return {"direct": f"{base}/direct/v1/chat/completions", "floor": f"{base}/floor/v1/chat/completions",
            "proxy": f"{base}/v1/chat/completions"}


def _measure(urls: dict[str, str], engine: str, payload: dict, duration: float) -> list[dict[str, Any]]:
    rows = []
    for c in CONCURRENCY:
        for path in ("direct", "floor", "proxy"):
            r = asyncio.run(_load(urls[path], c, duration, payload))
            rows.append({"engine": engine, "path": path, **r})
            print(f"  {engine:5s} {path:6s} c={c:<3d} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                  f"{r['rps']:7.1f} req/s  errors {r['errors']}", flush=True)
    return rows


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine and concurrency: proxy vs direct and vs floor (added p50, p50 ratio, throughput ratio)."""
    out = []
    by = {(r["engine"], r["c"], r["path"]): r for r in rows}
    for engine, c in sorted({(r["engine"], r["c"]) for r in rows}):
        d, f, p = by[(engine, c, "direct")], by[(engine, c, "floor")], by[(engine, c, "proxy")]
        out.append({
            "engine": engine, "c": c,
            "added_p50_vs_direct_ms": p["p50_ms"] - d["p50_ms"],
            "added_p50_vs_floor_ms": p["p50_ms"] - f["p50_ms"],
            "p50_over_floor": p["p50_ms"] / f["p50_ms"],
            "rps_vs_direct": p["rps"] / d["rps"],
            "rps_vs_floor": p["rps"] / f["rps"],
        })
    return out


def _markdown(rows, summary, meta) -> str:
    lines = [f"# Proxy overhead ({meta['mode']}, {meta['duration_s']} s per point, {os.cpu_count()} cores)", "",
             "| engine | c | path | p50 ms | p99 ms | req/s | errors |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['engine']} | {r['c']} | {r['path']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['rps']:.1f} | {r['errors']} |" for r in rows]
    lines += ["", "| engine | c | proxy p50 − direct (ms) | proxy p50 − floor (ms) | proxy p50 / floor | "
              "proxy req/s / direct | proxy req/s / floor |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {s['engine']} | {s['c']} | {s['added_p50_vs_direct_ms']:+.2f} | "
              f"{s['added_p50_vs_floor_ms']:+.2f} | {s['p50_over_floor']:.2f}× | {s['rps_vs_direct']:.0%} | "
              f"{s['rps_vs_floor']:.0%} |" for s in summary]
    return "\n".join(lines) + "\n"


def _print_table(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="clawray Proxy overhead")
    for col in ("engine", "c", "p50 +direct ms", "p50 +floor ms", "p50/floor", "rps/direct", "rps/floor"):
        t.add_column(col, justify="right")
    for s in summary:
        t.add_row(s["engine"], str(s["c"]), f"{s['added_p50_vs_direct_ms']:+.2f}",
                  f"{s['added_p50_vs_floor_ms']:+.2f}", f"{s['p50_over_floor']:.2f}×",
                  f"{s['rps_vs_direct']:.0%}", f"{s['rps_vs_floor']:.0%}")
    Console().print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds measured per point")
    ap.add_argument("--real", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--ha-proxy", action="store_true", help="RAY_SERVE_ENABLE_HA_PROXY=1 (HAProxy ingress)")
    ap.add_argument("--port", type=int, default=18931)
    args = ap.parse_args()
    if args.ha_proxy:  # read by the Serve controller at start: must be in the env before Ray starts
        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ray

    from core.config import load_config

    cfg = load_config(REPO / "configs" / "local.yaml")
    ray.init(address="local", num_cpus=8, namespace="clawray-bench", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    rows: list[dict[str, Any]] = []
    storage = tempfile.mkdtemp(prefix="clawray-bench-")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        if True:
            payload = {"model": "clawray-policy", "messages": MESSAGES, "max_tokens": 8}
            urls = _deploy(FakeEngine.bind(), storage, args.port)
            rows += _measure(urls, "fake", payload, args.duration)
            if args.real:
                from cluster.serve_app import check_serving_config, engine_env

                check_serving_config(cfg)
                real = _real_engine_cls().options(ray_actor_options={
                    "num_cpus": 1, "runtime_env": {"env_vars": engine_env(cfg)}}).bind(
                    cfg.model_path(), cfg.model.model_dump(), cfg.engine.model_dump(), storage)
                for app in ("bench-proxy", "bench-floor", "bench-engine"):
                    serve.delete(app)
                urls = _deploy(real, storage, args.port)
                rows += _measure(urls, "tiny", payload, args.duration)
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)  # after shutdown: replicas write into it until then
    summary = _summary(rows)
    meta = {"mode": "HAProxy ingress" if args.ha_proxy else "default Serve HTTP proxy",
            "duration_s": args.duration, "cores": os.cpu_count(), "time": time.time()}
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "proxy_overhead-haproxy" if args.ha_proxy else "proxy_overhead"
    (OUT / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=2))
    (OUT / f"{stem}.md").write_text(_markdown(rows, summary, meta))
    _print_table(summary)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
