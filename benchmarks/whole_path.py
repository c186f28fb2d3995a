"""The whole request path as a user sees it (issue 19 item 1): clawray in upstream mode against a bare
Python pass-through proxy (the floor) and LiteLLM's proxy, all in front of the same upstream. A benchmark,
not a test.

Paths, each a server of its own (benchmarks/whole_path_servers.py), driven by one aiohttp client with
non-streaming chat completions at concurrency 1, 16 and 64:
- direct:   the client talks to the upstream itself (the baseline every "added" figure is against);
- direct-skills: the client sends the upstream, itself, the request clawray would send it (the skills block
            clawray's retrieval picks for it in the system prompt, and the capture fields `logprobs` and
            `return_token_ids`): what the engine's extra work for an injected request costs without any
            proxy. A clawray path's p50 over this one is clawray's own share of its "added";
- direct-block / direct-capture: the two halves of direct-skills apart, to split the engine's extra work
            for an injected request: the skills block without the capture fields, and the capture fields
            (the sampled tokens' logprobs, the prompt's and reply's token ids) without the block;
- floor:    a bare pass-through proxy (aiohttp server + aiohttp client): what Python costs at all;
- litellm:  LiteLLM's proxy, one worker, in its own venv (.cache/bench-litellm, built on first use);
- clawray:  the embedded default's layout (`configs/local.yaml`, co-located) with `engine.backend:
            upstream`, Serve's own HTTP proxy in front (`proxy.http_ingress: serve`);
- clawray-haproxy: the same with `proxy.http_ingress: haproxy` (Ray Serve's HAProxy ingress, run through
            clawray's loopback wrapper): what the embedded default (`auto`) serves with since 2026-12-07.
clawray runs with skills injected (a seeded library: 6 skills, ~7.4 KB, go into every request) and capture
on: each conversation is two requests (the second continues the first and ends the session), so every
turn is stored, completed with its next state and delivered to the default sink (the JSON-lines file).
The upstream is instant (a raw asyncio server answering like vLLM with token ids and logprobs), or with
`--tiny` also the tiny model on vLLM's own OpenAI server.

Per path: p50/p99, req/s, and the server CPU per request: user + system time of every process of its
server (Ray's processes included, idle ones too), over the requests served. The paths take turns in
rounds so that load from other processes drifts over all of them alike. Memory: summed RSS and PSS of
each server's processes after the load.

Usage: python -m benchmarks.whole_path [--duration 6] [--rounds 3] [--tiny] [--quick] [--paths a,b]
Writes benchmarks/out/whole_path.json and .md and prints the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
sys.path.insert(0, str(REPO))
from benchmarks.whole_path_servers import KEY_ENV, REPLY_TEXT, UPSTREAM_MODEL, litellm_command, seed_skills  # noqa: E402

CONCURRENCY = (1, 16, 64)
Prepare = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
PATHS = ("direct", "direct-skills", "direct-block", "direct-capture", "floor", "litellm", "clawray", "clawray-haproxy")
# Paths without a server of their own (the client talks to the upstream), and what their requests carry of
# clawray's additions: the skills block, the capture fields.
CLIENT_SIDE = {"direct": (False, False), "direct-skills": (True, True), "direct-block": (True, False),
               "direct-capture": (False, True)}
SYSTEM = "You are a helpful assistant for a busy person. Answer briefly and precisely."
QUESTION = "Plan my day: three meetings at 9, 11 and 2 and a dentist appointment at 4. Move the dentist to the morning."
FOLLOW_UP = "Thanks. Now reschedule the 11 o'clock meeting to the afternoon."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One server process (its own session: stopped with its whole process group)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int, ready_line: bool = True):
        self.name, self.port = name, port
        # Only our own servers' stdout is read (their READY line): a pipe nobody reads fills up and blocks
        # a server that logs to stdout (vLLM does).
        self.proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env},
                                     stdout=subprocess.PIPE if ready_line else subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        self.ready_line = ready_line

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.time() + timeout_s
        if self.ready_line:
            line = self.proc.stdout.readline()
            if "READY" not in line:
                raise RuntimeError(f"{self.name} did not start (exit {self.proc.poll()})")
            return
        while time.time() < deadline:  # a server of someone else's (LiteLLM, vLLM): poll its port
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not open port {self.port}")

    def processes(self) -> list:
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of its group left behind (Ray workers)


def _cpu_s(procs: list) -> float:
    import psutil

    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0) + getattr(t, "children_system", 0)
    return total


def _memory_mb(procs: list) -> dict[str, Any]:
    """Summed RSS and PSS (shared pages split between the processes that map them) and the biggest
    processes by PSS, named by what they run."""
    import psutil

    rss = pss = 0
    each = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            m = p.memory_full_info()
            rss, pss = rss + m.rss, pss + getattr(m, "pss", m.rss)
            cmd = " ".join(p.cmdline())
            words = cmd.split()
            name = next((w for w in words if w.startswith(("ray::", "ServeReplica", "SERVE_"))), None) or next(
                (Path(w).name for w in words if w.endswith(".py") or w.startswith("benchmarks.")), p.name())
            each.append((name[:60], getattr(m, "pss", m.rss) / 2**20))
    each.sort(key=lambda x: -x[1])
    return {"processes": len(procs), "rss_mb": rss / 2**20, "pss_mb": pss / 2**20,
            "top": [[n, round(v)] for n, v in each[:12]]}


# ---- load ------------------------------------------------------------------------------------------------

async def _load(url: str, c: int, duration: float, warmup: float, model: str, max_tokens: int,
                echo: bool = False, prepare: Prepare | None = None) -> dict[str, Any]:
    """`c` workers run two-request conversations back to back; latencies of 2xx replies after warmup.
    `prepare`: what is done to each request body before it is timed and sent (`direct-skills`)."""
    import aiohttp

    lat: list[float] = []
    errors = total = 0
    statuses: dict[int, int] = {}
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + duration
    key = os.environ[KEY_ENV]

    async def post(http, body: dict, headers: dict) -> tuple[int, bytes, float]:
        t0 = time.perf_counter()
        async with http.post(url, data=json.dumps(body).encode(), headers=headers) as r:
            data = await r.read()
            return r.status, data, t0

    async def worker(i: int, http) -> None:
        nonlocal errors, total
        n = 0
        while time.perf_counter() < t_end:
            sid = f"wp-{c}-{i}-{n}-{t_start}"
            n += 1
            base = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", "X-Session-Id": sid}
            # Each conversation's own question: nothing downstream may serve it from a cache.
            first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{QUESTION} (ref {sid})"}]
            reply = REPLY_TEXT
            for step in (0, 1):
                if step == 0:
                    body, headers = {"model": model, "messages": first, "max_tokens": max_tokens}, base
                else:
                    msgs = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
                    body, headers = {"model": model, "messages": msgs, "max_tokens": max_tokens}, {
                        **base, "X-Session-Done": "1"}
                if prepare is not None:
                    body = await prepare(body)
                status, data, t0 = await post(http, body, headers)
                t1 = time.perf_counter()
                total += 1
                if echo and status == 200 and step == 0:  # a real engine's reply is what the client echoes
                    reply = json.loads(data)["choices"][0]["message"]["content"] or ""
                if status != 200:
                    statuses[status] = statuses.get(status, 0) + 1
                if t0 >= t_measure:
                    if status == 200:
                        lat.append(t1 - t0)
                    else:
                        errors += 1
                if status != 200 or t1 >= t_end:
                    break

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as http:
        await asyncio.gather(*(worker(i, http) for i in range(c)))
    return {"lat": lat, "errors": errors, "statuses": statuses, "total": total}


def skills_preparer(workdir: Path, block: bool = True, capture: bool = True) -> Prepare:
    """`direct-skills`' request: the body with what clawray's Proxy adds before it calls the upstream, made
    by clawray's own code over the same seeded library as the clawray servers (`seed_skills`), with the
    embedded default's skills config: the retrieved skills block in the system prompt (serve/injection.py)
    and the capture fields (serve/upstream_wire.py). Nothing else of the Proxy's work is done. Without
    `block` or `capture`, that half is left out (`direct-capture`, `direct-block`)."""
    from core.config import load_config
    from serve.injection import SkillInjector
    from serve.upstream_wire import Caps, upstream_payload

    skills_dir = workdir / "direct-skills" / "skills"
    if not skills_dir.is_dir():
        seed_skills(skills_dir)
    injector = SkillInjector.build(load_config(REPO / "configs" / "local.yaml").skills, skills_dir) if block else None
    caps = Caps() if capture else Caps(logprobs=False, token_ids=False)

    async def prepare(body: dict[str, Any]) -> dict[str, Any]:
        body = {**body, "messages": list(body["messages"])}
        if injector is not None:
            await injector.inject_block(body, False)
        return upstream_payload(body, UPSTREAM_MODEL, caps)[0]

    return prepare


def _row(path: str, c: int, acc: dict[str, Any], duration: float) -> dict[str, Any]:
    lat = sorted(acc["lat"])
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else (lat or [float("nan")]) * 99
    return {"path": path, "c": c, "n": len(lat), "errors": acc["errors"], "error_statuses": acc["statuses"],
            "rps": len(lat) / duration, "p50_ms": 1000 * q[49], "p99_ms": 1000 * q[98],
            "cpu_ms": 1000 * acc["cpu"] / max(acc["total"], 1), "client_cpu_ms": 1000 * acc["client"] / max(acc["total"], 1)}


def measure(urls: dict[str, str], servers: dict[str, Server], engine: str, duration: float, rounds: int,
            model: str, max_tokens: int, prepares: dict[str, Prepare] | None = None) -> list[dict[str, Any]]:
    echo = engine != "instant"
    prepares = prepares or {}
    import psutil

    me = psutil.Process()
    for path, url in urls.items():  # first requests are slow (connections, a real engine's first generate)
        asyncio.run(_load(url, 1, 2.0, 0.0, model, max_tokens, echo, prepares.get(path)))
    rows = []
    for c in CONCURRENCY:
        acc = {p: {"lat": [], "errors": 0, "statuses": {}, "total": 0, "cpu": 0.0, "client": 0.0} for p in urls}
        for _ in range(rounds):
            for path, url in urls.items():
                procs = servers[path].processes() if path in servers else []
                cpu0, own0 = _cpu_s(procs), sum(me.cpu_times()[:2])
                r = asyncio.run(_load(url, c, duration / rounds, 0.3, model, max_tokens, echo, prepares.get(path)))
                cpu1, own1 = _cpu_s(procs), sum(me.cpu_times()[:2])
                a = acc[path]
                a["lat"] += r["lat"]
                a["errors"] += r["errors"]
                a["total"] += r["total"]
                a["cpu"] += cpu1 - cpu0
                a["client"] += own1 - own0
                for k, v in r["statuses"].items():
                    a["statuses"][k] = a["statuses"].get(k, 0) + v
        for path in urls:
            row = {"engine": engine, **_row(path, c, acc[path], duration)}
            rows.append(row)
            print(f"  {engine:7s} {path:16s} c={c:<3d} p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                  f"{row['rps']:7.1f} req/s  err {row['errors']} {row['error_statuses'] or ''}  "
                  f"server CPU {row['cpu_ms']:.2f} ms/req  client {row['client_cpu_ms']:.2f}", flush=True)
    return rows


# ---- servers ---------------------------------------------------------------------------------------------

def _py(role: str, port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.whole_path_servers", role, "--port", str(port), *args]


def start_proxies(upstream: str, paths: list[str], workdir: Path) -> tuple[dict[str, Server], dict[str, str]]:
    """The proxies in front of `upstream` (an OpenAI base URL ending in /v1), started side by side."""
    servers: dict[str, Server] = {}
    env = {"PYTHONPATH": str(REPO)}
    for path in paths:
        port = _free_port()
        if path == "floor":
            servers[path] = Server(path, _py("floor", port, "--upstream", upstream), env, port)
        elif path == "litellm":
            cmd, lenv = litellm_command(port, upstream, workdir)
            servers[path] = Server(path, cmd, lenv, port, ready_line=False)
        elif path in ("clawray", "clawray-haproxy"):
            ingress = "haproxy" if path == "clawray-haproxy" else "serve"
            servers[path] = Server(path, _py("clawray", port, "--upstream", upstream, "--ingress", ingress), env, port)
    try:
        for s in servers.values():
            s.wait_ready()
    except BaseException:
        for s in servers.values():
            s.stop()
        raise
    urls = {p: f"http://127.0.0.1:{s.port}/v1/chat/completions" for p, s in servers.items()}
    return servers, urls


def start_tiny_vllm(port: int) -> Server:
    """The tiny model on vLLM's own OpenAI server (CPU), returning token ids when asked, like a vLLM upstream."""
    from core.config import load_config

    cfg = load_config(REPO / "configs" / "local.yaml")
    # Both names: clients (and LiteLLM's route) ask for clawray-policy, clawray's upstream config for up-model.
    # 8192 of the model's 65536 positions: the injected skills alone are ~2,800 of its tokens.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg.model_path(),
           "--served-model-name", UPSTREAM_MODEL, "clawray-policy", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "8192", "--enforce-eager"]
    from serve.vllm_engine import vllm_private_dir, vllm_temp_env

    # Its sockets and temp files in a folder of its own (swept by the next engine start once it is gone).
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(cfg.cache_path() / "vllm"),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", **vllm_temp_env(vllm_private_dir())}
    return Server("vllm", cmd, env, port, ready_line=False)


def _wait_http(url: str, timeout_s: float = 240) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(url)


# ---- report ----------------------------------------------------------------------------------------------

def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine and path: added p50/p99 over direct at c=1, req/s at each c, CPU per request, goals; for a
    clawray path with `direct-skills` measured, its own share: p50 at c=1 over that of the request it sends."""
    by = {(r["engine"], r["path"], r["c"]): r for r in rows}
    out = []
    for engine, path in dict.fromkeys((r["engine"], r["path"]) for r in rows):
        d1, p1 = by[(engine, "direct", 1)], by[(engine, path, 1)]
        s = {"engine": engine, "path": path, "added_p50_ms": p1["p50_ms"] - d1["p50_ms"],
             "added_p99_ms": p1["p99_ms"] - d1["p99_ms"],
             "rps": {c: by[(engine, path, c)]["rps"] for c in CONCURRENCY},
             "cpu_ms": {c: by[(engine, path, c)]["cpu_ms"] for c in CONCURRENCY},
             "errors": sum(by[(engine, path, c)]["errors"] for c in CONCURRENCY)}
        skilled = by.get((engine, "direct-skills", 1))
        if skilled is not None and path.startswith("clawray"):  # the same request at the engine, without clawray
            s["own_p50_ms"] = p1["p50_ms"] - skilled["p50_ms"]
        if engine == "instant" and path.startswith("clawray"):
            s["goals"] = {"added_p50_le_1.5ms": s["added_p50_ms"] <= 1.5, "rps_c16_ge_500": s["rps"][16] >= 500,
                          "cpu_le_2ms": max(s["cpu_ms"].values()) <= 2.0}
        out.append(s)
    return out


def markdown(summ: list[dict[str, Any]], rows: list[dict[str, Any]], memory: dict[str, Any], meta: dict) -> str:
    lines = [f"# Whole request path ({meta['duration_s']} s per point in {meta['rounds']} rounds, {meta['cores']} "
             f"cores, load average {meta['load_start']:.1f} at start, {meta['load_end']:.1f} at the end)", ""]
    for engine in dict.fromkeys(s["engine"] for s in summ):
        these = [x for x in summ if x["engine"] == engine]
        own = any("own_p50_ms" in x for x in these)
        lines += [f"## {engine} upstream", "",
                  "| path | added p50 / p99, c=1 |" + (" of which clawray's own, p50 c=1 |" if own else "")
                  + " req/s c=1 / 16 / 64 | server CPU ms/req c=1 / 16 / 64 | errors |",
                  "|---|---|" + ("---|" if own else "") + "---|---|---|"]
        for s in these:
            added = "—" if s["path"] == "direct" else f"{s['added_p50_ms']:+.2f} / {s['added_p99_ms']:+.2f} ms"
            mine = (f" {s['own_p50_ms']:+.2f} ms |" if "own_p50_ms" in s else " — |") if own else ""
            lines.append(f"| {s['path']} | {added} |{mine} " + " / ".join(f"{s['rps'][c]:.0f}" for c in CONCURRENCY)
                         + " | " + " / ".join(f"{s['cpu_ms'][c]:.2f}" for c in CONCURRENCY) + f" | {s['errors']} |")
        if own:
            lines += ["", "direct-skills: the client sends the upstream itself what clawray would send it (the retrieved "
                      "skills block, the capture fields). Its \"added\" is the engine's extra work for the injected "
                      "request; a clawray path's own share is its p50 over direct-skills'."]
        if any(x["path"] in ("direct-block", "direct-capture") for x in these):
            lines += ["", "direct-block / direct-capture: direct-skills' two halves apart (the skills block without the "
                      "capture fields; the capture fields without the block)."]
        lines.append("")
    lines += ["| path | c | p50 ms | p99 ms | req/s | server CPU ms/req | client CPU ms/req |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['engine']}/{r['path']} | {r['c']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['rps']:.1f} | "
              f"{r['cpu_ms']:.2f} | {r['client_cpu_ms']:.2f} |" for r in rows]
    if memory:
        lines += ["", "| server (after the load) | processes | RSS MB | PSS MB |", "|---|---|---|---|"]
        lines += [f"| {k} | {m['processes']} | {m['rss_mb']:.0f} | {m['pss_mb']:.0f} |" for k, m in memory.items()]
        lines += ["", "Biggest processes by PSS (MB): " + "; ".join(
            f"{k}: " + ", ".join(f"{n} {v}" for n, v in m["top"][:8]) for k, m in memory.items())]
    return "\n".join(lines) + "\n"


def _phase(engine: str, upstream: str, paths: list[str], workdir: Path, args, memory: dict) -> list[dict]:
    servers, urls = start_proxies(upstream, [p for p in paths if p not in CLIENT_SIDE], workdir)
    try:
        urls = {**{p: upstream + "/chat/completions" for p in CLIENT_SIDE if p in paths}, **urls}
        prepares = {p: skills_preparer(workdir, *CLIENT_SIDE[p]) for p in paths if p in CLIENT_SIDE and p != "direct"}
        model, max_tokens = "clawray-policy", 8
        rows = measure(urls, servers, engine, args.duration, args.rounds, model, max_tokens, prepares)
        if not memory:  # after the load, once per run
            memory.update({p: _memory_mb(s.processes()) for p, s in servers.items()})
        return rows
    finally:
        for s in servers.values():
            s.stop()


def _write(rows: list[dict], memory: dict, meta: dict, stem: str) -> str:
    """Outputs so far (after each phase: a later phase that fails leaves the earlier ones written)."""
    summ = summary(rows) if "direct" in meta["paths"] else []
    meta = {**meta, "time": time.time(), "load_end": os.getloadavg()[0]}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summ,
                                                  "memory": memory}, indent=2))
    text = markdown(summ, rows, memory, meta)
    (OUT / f"{stem}.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=6.0, help="seconds measured per point (over all rounds)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="also in front of the tiny model on vLLM")
    ap.add_argument("--tiny-only", action="store_true", help="only in front of the tiny model (whole_path-tiny.*)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1.5 s per point, one round")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.rounds = 1.5, 1
    paths = [p for p in args.paths.split(",") if p]
    if unknown := set(paths) - set(PATHS):
        ap.error(f"unknown paths {sorted(unknown)}; valid: {', '.join(PATHS)}")
    os.environ.setdefault(KEY_ENV, f"sk-bench-{os.getpid()}")
    workdir = Path(tempfile.mkdtemp(prefix="clawray-wholepath-"))
    meta = {"duration_s": args.duration, "rounds": args.rounds, "cores": os.cpu_count(),
            "load_start": os.getloadavg()[0], "paths": paths}
    stem = "whole_path-tiny" if args.tiny_only else "whole_path"
    rows: list[dict] = []
    memory: dict[str, Any] = {}
    if not args.tiny_only:
        port = _free_port()
        upstream = Server("upstream", _py("upstream", port), {"PYTHONPATH": str(REPO)}, port)
        try:
            upstream.wait_ready()
            rows += _phase("instant", f"http://127.0.0.1:{port}/v1", paths, workdir, args, memory)
        finally:
            upstream.stop()
        text = _write(rows, memory, meta, stem)
    if args.tiny or args.tiny_only:
        vport = _free_port()
        vllm = start_tiny_vllm(vport)
        try:
            vllm.wait_ready()
            _wait_http(f"http://127.0.0.1:{vport}/v1/models")
            rows += _phase("tiny", f"http://127.0.0.1:{vport}/v1", paths, workdir, args, memory)
        finally:
            vllm.stop()
        text = _write(rows, memory, meta, stem)
    print(text)


if __name__ == "__main__":
    main()
