"""The servers of benchmarks/whole_path.py, each run as its own process (so its CPU and memory are its
process tree's): an instant OpenAI-compatible upstream, a bare pass-through floor, LiteLLM's proxy (in
its own venv) and clawray in upstream mode (the embedded default's layout), with Serve's HTTP proxy or
with HAProxy. A benchmark, not a test.

Usage (the benchmark starts these itself): python -m benchmarks.whole_path_servers
    upstream --port P | floor --port P --upstream URL | clawray --port P --upstream URL --ingress serve|haproxy
Each prints "READY" on stdout once it serves, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "CLAWRAY_BENCH_API_KEY"
REPLY_TEXT = "Dentist moved to 8:30; the meetings stay where they are."
UPSTREAM_MODEL = "up-model"  # the model name clawray's upstream endpoint asks for (the tiny vLLM serves it too)
RESPONSE_LEN = 16  # sampled tokens per reply (ids + logprobs, as vLLM returns them when asked)
LITELLM_VENV = REPO / ".cache" / "bench-litellm"
LITELLM_PIN = "litellm[proxy]==1.106.12"  # 1.108+ moved the proxy into a package the index lacks; 1.107.0 was compromised


# ---- an instant OpenAI-compatible upstream (vLLM-like: token ids and logprobs when asked) ---------------

def _reply(body_len: int) -> bytes:
    """The reply to a request of `body_len` bytes: prompt ids ~ one per 4 bytes of the request, as a
    tokenizer would roughly give, so capture stores what a real vLLM upstream would send."""
    prompt = list(range(max(8, body_len // 4)))
    return json.dumps({
        "id": "chatcmpl-instant", "object": "chat.completion", "created": 0, "model": "up-model",
        "prompt_token_ids": prompt,
        "choices": [{"index": 0, "finish_reason": "stop", "token_ids": list(range(RESPONSE_LEN)),
                     "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                                              for _ in range(RESPONSE_LEN)]},
                     "message": {"role": "assistant", "content": REPLY_TEXT}}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": RESPONSE_LEN,
                  "total_tokens": len(prompt) + RESPONSE_LEN},
    }).encode()


class _Upstream(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: every POST gets the canned chat completion, at once. Raw
    asyncio so that the upstream takes as little of the shared cores as possible."""

    def connection_made(self, transport):
        self.t, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length:]
            body = _reply(length) if head.startswith("POST") else b'{"object":"list","data":[]}'
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)


async def serve_upstream(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
    async with server:
        _ready()
        await _until_stopped()


# ---- the floor: a bare pass-through proxy (aiohttp server + aiohttp client) --------------------------------

async def serve_floor(port: int, upstream: str) -> None:
    import aiohttp
    from aiohttp import web

    async def forward(request: web.Request) -> web.Response:
        async with http.post(upstream + "/chat/completions", data=await request.read(),
                             headers={"Content-Type": "application/json"}) as r:
            return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    _ready()
    await _until_stopped()
    await http.close()
    await runner.cleanup()


# ---- LiteLLM's proxy, in its own venv --------------------------------------------------------------------

def ensure_litellm() -> Path:
    """The LiteLLM venv under .cache/ (never the project's venv); built on first use (~1-2 minutes)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM_PIN], check=True)
    return exe


def litellm_command(port: int, upstream: str, workdir: Path) -> tuple[list[str], dict[str, str]]:
    """LiteLLM proxy with one worker, one model routed to `upstream`, no database, no callbacks."""
    cfg = workdir / "litellm.yaml"
    cfg.write_text(json.dumps({  # JSON is YAML
        "model_list": [{"model_name": "clawray-policy",
                        "litellm_params": {"model": "openai/up-model", "api_base": upstream, "api_key": "sk-up"}}],
        "litellm_settings": {"drop_params": True, "telemetry": False, "turn_off_message_logging": True},
        "general_settings": {"master_key": os.environ[KEY_ENV]},
    }))
    env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True",
           "HOME": str(workdir)}
    return [str(ensure_litellm()), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"], env


# ---- clawray in upstream mode -------------------------------------------------------------------------------

def seed_skills(skills_dir: Path, n_general: int = 24, n_task: int = 12) -> None:
    """A library whose template retrieval injects 6 general skills (~7.4 KB) into every request of the
    benchmark's planning conversation: what a grown library costs a request. The 12 task skills ("scheduling")
    are never picked: evolve/text.py's keyword typing calls the first question file_operations ("Move the
    dentist") and the follow-up productivity. Kept as it is, so that runs stay comparable."""
    from core.config import SkillsConfig
    from core.contracts import Skill
    from evolve.bank import SkillBank

    rule = ("When the user asks to plan or reschedule, list every fixed appointment first, keep the times the "
            "user stated, say which item moved and why, and confirm the new time in one short sentence. ")
    skills = [Skill(name=f"general-habit-{i:02d}", description=f"General habit {i}: plan, check and confirm.",
                    category="general", body=(f"Habit {i}. " + rule * 6)) for i in range(n_general)]
    skills += [Skill(name=f"schedule-rule-{i:02d}", description=f"Scheduling rule {i} for calendars and meetings.",
                     category="scheduling", body=(f"Rule {i}. " + rule * 6)) for i in range(n_task)]
    SkillBank(skills_dir, SkillsConfig()).add_batch(skills)


def serve_clawray(port: int, upstream: str, ingress: str) -> None:
    import ray
    from ray import serve

    from cluster.runtime import local_system_config
    from cluster.serve_app import build_app, ingress_env
    from core import names
    from core.config import UpstreamEndpoint, load_config

    storage = Path(tempfile.mkdtemp(prefix="clawray-wholepath-"))
    cfg = load_config(REPO / "configs" / "local.yaml")
    ep = UpstreamEndpoint(base_url=upstream, model=UPSTREAM_MODEL)
    cfg = cfg.model_copy(update={
        "storage_root": str(storage),
        "engine": cfg.engine.model_copy(update={"backend": "upstream", "upstream": ep}),
        "proxy": cfg.proxy.model_copy(update={"api_key_env": KEY_ENV, "admin_key_env": "CLAWRAY_BENCH_NO_ADMIN",
                                              "port": port, "http_ingress": ingress}),
    })
    os.environ.update(ingress_env(cfg))  # before Ray starts, as `clawray start` does
    seed_skills(storage / "skills")
    ray.init(address="local", num_cpus=cfg.ray.num_cpus, include_dashboard=cfg.ray.include_dashboard,
             namespace=cfg.ray.namespace, log_to_driver=False, configure_logging=False,
             _system_config=local_system_config(cfg.ray.prestart_workers),  # as `clawray start` starts its cluster
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(cfg), name=names.APP, route_prefix="/", blocking=False)
        _wait_healthy(port)
        _ready()
        asyncio.run(_until_stopped())
    finally:
        serve.shutdown()
        ray.shutdown()


def _wait_healthy(port: int, timeout_s: float = 180) -> None:
    import time

    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("clawray did not become healthy")


# ---- plumbing ---------------------------------------------------------------------------------------------

def _ready() -> None:
    print("READY", flush=True)


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["upstream", "floor", "clawray"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", default="")
    ap.add_argument("--ingress", choices=["serve", "haproxy"], default="serve")
    args = ap.parse_args()
    if args.role == "upstream":
        asyncio.run(serve_upstream(args.port))
    elif args.role == "floor":
        asyncio.run(serve_floor(args.port, args.upstream))
    else:
        serve_clawray(args.port, args.upstream, args.ingress)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
