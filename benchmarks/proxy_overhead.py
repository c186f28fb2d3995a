"""What the clawray Proxy adds to a request, measured (issue 3 "Speed"). A benchmark, not a test.

Three HTTP paths to the same engine deployment, all through Ray Serve's HTTP proxy, driven by one aiohttp
client at concurrency 1, 16 and 64 (non-streaming OpenAI chat completions):

- direct: the engine deployment itself serves `/v1/chat/completions` (no ingress in front of it);
- floor:  an empty pass-through FastAPI ingress that only forwards the body through a deployment handle;
- proxy:  clawray's `Proxy` (auth, session meta, skill hook, capture -> Turn -> SQLite session store,
          outbox dispatcher) forwarding through the same kind of handle.

and two engines: an instant fake (`FakeEngine`: returns a canned reply and a fake token capture, so the
proxy is what is measured) and the real tiny model on vLLM (`--real`, on by default; `--no-real` skips).

Usage: python -m benchmarks.proxy_overhead [--duration 3] [--no-real] [--quick] [--ha-proxy] [--port N]
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

from benchmarks.report import LAYOUT_LABELS

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
CONCURRENCY = (1, 16, 64)
KEY_ENV = "CLAWRAY_BENCH_API_KEY"  # the Proxy checks a key, as it must beyond loopback or with HAProxy
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


# ---- co-located: the Proxy with the engine in its own replica (no handle hop) ---------------------------

def _colocated_cls():
    from serve.local_handle import LocalHandle
    from serve.proxy import Proxy

    class ColocatedProxy(Proxy.func_or_class):
        async def __init__(self, make_engine, *args):
            engine = make_engine()
            if hasattr(engine, "start"):
                await engine.start()
            await super().__init__(LocalHandle(engine), *args)

    return ColocatedProxy


# ---- load ----------------------------------------------------------------------------------------------

async def _load(url: str, c: int, duration: float, payload: dict, warmup: float = 0.5) -> dict[str, Any]:
    """`c` workers POST `payload` back to back for `duration` s; latencies of 2xx replies after warmup."""
    import aiohttp

    data = json.dumps(payload).encode()
    lat: list[float] = []
    errors = total = 0
    statuses: dict[int, int] = {}
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + duration
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as http:

        async def worker(i: int) -> None:
            nonlocal errors, total
            headers = {"Content-Type": "application/json", "X-Session-Id": f"bench-{c}-{i}-{t_start}",
                       "Authorization": f"Bearer {os.environ.get(KEY_ENV, '')}"}
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                async with http.post(url, data=data, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
                    if not ok:
                        statuses[r.status] = statuses.get(r.status, 0) + 1
                t1 = time.perf_counter()
                total += 1
                if t0 >= t_measure:
                    if ok:
                        lat.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(i) for i in range(c)))
    return {"lat": lat, "errors": errors, "statuses": statuses, "total": total}


def _row(engine: str, path: str, c: int, acc: dict[str, Any], duration: float) -> dict[str, Any]:
    lat = sorted(acc["lat"])
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else (lat or [float("nan")]) * 99
    n = max(acc["total"], 1)
    return {"engine": engine, "path": path, "c": c, "n": len(lat), "errors": acc["errors"],
            "error_statuses": acc["statuses"], "rps": len(lat) / duration, "p50_ms": 1000 * q[49],
            "p99_ms": 1000 * q[98], "cpu_ms": {k: 1000 * v / n for k, v in acc["cpu"].items()}}


ROLES = {"http": ("ProxyActor", "haproxy"), "engine": ("ServeReplica:bench-engine:",),
         "floor": ("ServeReplica:bench-floor:",), "proxy": ("ServeReplica:bench-proxy:",),
         "colo": ("ServeReplica:bench-colo:",)}  # co-located: Proxy + engine, one replica


def _processes() -> dict[str, list]:
    """Our own Ray processes by role (descendants of this driver: other clusters on the host excluded)."""
    import psutil

    out: dict[str, list] = {r: [] for r in ROLES}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        for role, needles in ROLES.items():
            if any(n in cmd for n in needles):
                out[role].append(p)
    return out


def _cpu(procs: dict[str, list]) -> dict[str, float]:
    import psutil

    out = {}
    for role, ps in procs.items():
        total = 0.0
        for p in ps:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        out[role] = total
    return out


def _deploy(engine_dep, cfg, port: int, colocate=None) -> dict[str, str]:
    """Engine app (direct), floor app and the clawray Proxy app (built by the production builder), the
    latter two with a handle to the engine."""
    from cluster.serve_app import build_proxy

    serve.run(engine_dep, name="bench-engine", route_prefix="/direct")
    engine = serve.get_deployment_handle("Engine", app_name="bench-engine")
    serve.run(PassThrough.bind(engine), name="bench-floor", route_prefix="/floor")
    serve.run(build_proxy(cfg, engine), name="bench-proxy", route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    urls = {"direct": f"{base}/direct/v1/chat/completions", "floor": f"{base}/floor/v1/chat/completions",
            "proxy": f"{base}/v1/chat/completions"}
    if colocate is not None:
        from serve.proxy import PROXY_REPLICA_ENV

        dep = serve.deployment(name="Colocated", max_ongoing_requests=256)(_colocated_cls()).options(
            ray_actor_options={"num_cpus": 0.5, "runtime_env": {"env_vars": dict(PROXY_REPLICA_ENV)}})
        serve.run(dep.bind(colocate, cfg.proxy.model_dump(), cfg.skills.model_dump(), str(cfg.storage_path())),
                  name="bench-colo", route_prefix="/colo")
        urls["colocated"] = f"{base}/colo/v1/chat/completions"
    return urls


def _measure(urls: dict[str, str], engine: str, payload: dict, duration: float,
             rounds: int = 3) -> list[dict[str, Any]]:
    """Per concurrency, the paths take turns (`rounds` slices of duration/rounds each), so load from
    other processes on the host drifts over all of them alike; CPU seconds of each role per request."""
    import psutil

    rows, procs, me = [], _processes(), psutil.Process()
    for url in urls.values():  # first requests are slow (vLLM's first generate, connection set-up)
        asyncio.run(_load(url, 1, 2.0, payload, warmup=0.0))
    paths = [p for p in ("direct", "floor", "proxy", "colocated") if p in urls]
    ingress = {"direct": None, "floor": "floor", "proxy": "proxy", "colocated": "colo"}
    for c in CONCURRENCY:
        acc = {p: {"lat": [], "errors": 0, "statuses": {}, "total": 0,
                   "cpu": {"http_proxy": 0.0, "ingress": 0.0, "engine": 0.0, "client": 0.0}} for p in paths}
        for _ in range(rounds):
            for path in paths:
                cpu0, own0 = _cpu(procs), sum(me.cpu_times()[:2])
                r = asyncio.run(_load(urls[path], c, duration / rounds, payload, warmup=0.3))
                cpu1, own1 = _cpu(procs), sum(me.cpu_times()[:2])
                a = acc[path]
                a["lat"] += r["lat"]
                a["errors"] += r["errors"]
                a["total"] += r["total"]
                for k, v in r["statuses"].items():
                    a["statuses"][k] = a["statuses"].get(k, 0) + v
                a["cpu"]["http_proxy"] += cpu1["http"] - cpu0["http"]
                a["cpu"]["client"] += own1 - own0
                if ingress[path]:
                    a["cpu"]["ingress"] += cpu1[ingress[path]] - cpu0[ingress[path]]
                if path != "colocated":  # the engine replica (co-located: it is the ingress)
                    a["cpu"]["engine"] += cpu1["engine"] - cpu0["engine"]
        for path in paths:
            r = _row(engine, path, c, acc[path], duration)
            rows.append(r)
            cm = r["cpu_ms"]
            print(f"  {engine:5s} {path:9s} c={c:<3d} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                  f"{r['rps']:7.1f} req/s  err {r['errors']} {r['error_statuses'] or ''}  CPU ms/req: "
                  f"http {cm['http_proxy']:.2f} ingress {cm['ingress']:.2f} engine {cm['engine']:.2f} "
                  f"client {cm['client']:.2f}", flush=True)
    return rows


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine, concurrency and clawray path (proxy, colocated): versus direct and versus the floor."""
    out = []
    by = {(r["engine"], r["c"], r["path"]): r for r in rows}
    for engine, c, path in sorted({(r["engine"], r["c"], r["path"]) for r in rows}):
        if path not in ("proxy", "colocated"):
            continue
        d, f, p = by[(engine, c, "direct")], by[(engine, c, "floor")], by[(engine, c, path)]
        out.append({
            "engine": engine, "c": c, "path": path,
            "added_p50_vs_direct_ms": p["p50_ms"] - d["p50_ms"],
            "p50_over_floor": p["p50_ms"] / f["p50_ms"],
            "rps_vs_direct": p["rps"] / d["rps"],
            "rps_vs_floor": p["rps"] / f["rps"],
            "cpu_ms_per_req": sum(p["cpu_ms"][k] for k in ("http_proxy", "ingress", "engine")),
            "cpu_ms_per_req_direct": sum(d["cpu_ms"][k] for k in ("http_proxy", "ingress", "engine")),
            "target": _target(engine, c, d, f, p),
        })
    return out


def _target(engine: str, c: int, d: dict, f: dict, p: dict) -> str:
    """Issue 3's target, instant engine only: p50 <= direct + 1 ms, or within 1.5x of the floor when the
    handle hop alone costs more than 1 ms here; at c=64 also >= 90% of direct's throughput."""
    if engine != "fake":
        return ""
    hop_costs_more = f["p50_ms"] - d["p50_ms"] > 1.0
    ok = p["p50_ms"] - d["p50_ms"] <= 1.0 or (hop_costs_more and p["p50_ms"] <= 1.5 * f["p50_ms"])
    verdict = "p50 " + ("met" if ok else "missed")
    if c == 64:
        verdict += ", req/s " + ("met" if p["rps"] >= 0.9 * d["rps"] else "missed")
    return verdict


def _markdown(rows, summary, meta) -> str:
    lines = [f"# Proxy overhead ({meta['mode']}, {meta['duration_s']} s per point, {meta['cores']} cores, "
             f"load average at start {meta['loadavg']:.1f})", "",
             "| engine | c | path | p50 ms | p99 ms | req/s | errors | CPU ms/req: HTTP proxy | ingress | engine |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['engine']} | {r['c']} | {r['path']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['rps']:.1f} | {r['errors']} | {r['cpu_ms']['http_proxy']:.2f} | {r['cpu_ms']['ingress']:.2f} | "
              f"{r['cpu_ms']['engine']:.2f} |" for r in rows]
    lines += ["", "| engine | c | clawray path | p50 − direct (ms) | p50 / floor | req/s vs direct | "
              "req/s vs floor | server CPU ms/req (direct) | target |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {s['engine']} | {s['c']} | {LAYOUT_LABELS.get(s['path'], s['path'])} | "
              f"{s['added_p50_vs_direct_ms']:+.2f} | {s['p50_over_floor']:.2f}× | {s['rps_vs_direct']:.0%} | "
              f"{s['rps_vs_floor']:.0%} | {s['cpu_ms_per_req']:.2f} ({s['cpu_ms_per_req_direct']:.2f}) | "
              f"{s.get('target', '')} |" for s in summary]
    return "\n".join(lines) + "\n"


def _print_table(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="clawray Proxy overhead")
    for col in ("engine", "c", "path", "p50 −direct ms", "p50/floor", "rps/direct", "rps/floor", "target"):
        t.add_column(col, justify="right")
    for s in summary:
        t.add_row(s["engine"], str(s["c"]), LAYOUT_LABELS.get(s["path"], s["path"]), f"{s['added_p50_vs_direct_ms']:+.2f}",
                  f"{s['p50_over_floor']:.2f}×", f"{s['rps_vs_direct']:.0%}", f"{s['rps_vs_floor']:.0%}",
                  s.get("target", ""))
    Console().print(t)


def _run(cfg, real: bool, port: int, duration: float) -> list[dict[str, Any]]:
    payload = {"model": "clawray-policy", "messages": MESSAGES, "max_tokens": 8}
    urls = _deploy(FakeEngine.bind(), cfg, port, colocate=FakeEngineImpl)
    rows = _measure(urls, "fake", payload, duration)
    if not real:
        return rows
    from cluster.serve_app import build_colocated, check_serving_config, engine_env

    check_serving_config(cfg)
    for app in ("bench-colo", "bench-proxy", "bench-floor", "bench-engine"):
        serve.delete(app)
    dep = _real_engine_cls().options(ray_actor_options={"num_cpus": 1, "runtime_env": {"env_vars": engine_env(cfg)}})
    urls = _deploy(dep.bind(cfg.model_path(), cfg.model.model_dump(), cfg.engine.model_dump(),
                            str(cfg.storage_path())), cfg, port)
    # The co-located app has its own vLLM; both engines stay up so the paths can take turns (an idle
    # engine costs memory, not CPU).
    serve.run(build_colocated(cfg), name="bench-colo", route_prefix="/colo")
    urls["colocated"] = f"http://127.0.0.1:{port}/colo/v1/chat/completions"
    return rows + _measure(urls, "tiny", payload, duration)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ha_proxy_env() -> None:
    """HAProxy mode, read by Serve at start (so before Ray starts), with the ports and private folder clawray
    gives it (cluster/serve_app.py `haproxy_env`: free ports below the kernel's ephemeral range, so two runs
    on one host do not collide and no socket opened meanwhile takes one)."""
    import tempfile

    from cluster.serve_app import haproxy_env

    for name, value in haproxy_env(Path(tempfile.mkdtemp(prefix="cr-ha-bench-"))).items():
        os.environ.setdefault(name, value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds measured per point")
    ap.add_argument("--real", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 s per point, instant engine only")
    ap.add_argument("--ha-proxy", action="store_true", help="RAY_SERVE_ENABLE_HA_PROXY=1 (HAProxy ingress)")
    ap.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.real = 1.0, False
    args.port = args.port or _free_port()
    if args.ha_proxy:
        _ha_proxy_env()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault(KEY_ENV, f"sk-bench-{os.getpid()}")  # before Ray starts: replicas inherit it
    import ray

    from core.config import load_config

    cfg = load_config(REPO / "configs" / "local.yaml")
    ray.init(address="local", num_cpus=8, namespace="clawray-bench", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    storage = tempfile.mkdtemp(prefix="clawray-bench-")
    load0 = os.getloadavg()[0]
    # An API key; the admin routes stay off. Everything else is the embedded default.
    cfg = cfg.model_copy(update={"storage_root": storage, "proxy": cfg.proxy.model_copy(
        update={"api_key_env": KEY_ENV, "admin_key_env": "CLAWRAY_BENCH_NO_ADMIN"})})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        rows = _run(cfg, args.real, args.port, args.duration)
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)  # after shutdown: replicas write into it until then
    summary = _summary(rows)
    meta = {"mode": "HAProxy ingress" if args.ha_proxy else "default Serve HTTP proxy",
            "duration_s": args.duration, "cores": os.cpu_count(), "time": time.time(), "loadavg": load0}
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "proxy_overhead-haproxy" if args.ha_proxy else "proxy_overhead"
    (OUT / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=2))
    (OUT / f"{stem}.md").write_text(_markdown(rows, summary, meta))
    _print_table(summary)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
