"""A scripted OpenAI-compatible server for rewards tests (judge and OPD teacher), run in a thread.

Routes: POST /v1/chat/completions (scripted reply texts), POST /v1/completions (echo + logprobs for
token-id prompts, like vLLM), POST /tokenize (vLLM's route, ids from a given function).
Behaviour is switched at runtime through `FakeJudge.script`: `replies`, `fail_status`, `delay_s`.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    replies: list[str] = field(default_factory=lambda: ["Reasoning... Score: 1"])
    fail_status: int | None = None  # answer every request with this status
    fail_next: int = 0  # answer the next N requests with 500
    delay_s: float = 0.0
    reject_max_tokens_zero: bool = False
    tokenize: Callable[[str], list[int]] | None = None  # None = /tokenize answers 404
    logprob: Callable[[int, int], float] = lambda i, tok: -0.01 * (i + 1)  # (position, token) -> lp
    requests: list[dict[str, Any]] = field(default_factory=list)
    inflight: int = 0
    peak_inflight: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeJudge:
    """`with FakeJudge() as judge: judge.base_url` -> "http://127.0.0.1:<port>/v1"."""

    def __init__(self, script: Script | None = None, port: int | None = None):
        self.script = script or Script()
        self.port = port or free_port()
        self._counter = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _gate(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        body = await request.json()
        auth = request.headers.get("Authorization")
        self.script.requests.append({"path": request.path, "body": body, "auth": auth})
        s = self.script
        s.inflight += 1
        s.peak_inflight = max(s.peak_inflight, s.inflight)
        try:
            if s.delay_s:
                await asyncio.sleep(s.delay_s)
        finally:
            s.inflight -= 1
        status = s.fail_status or (500 if s.fail_next > 0 else None)
        if status:
            s.fail_next = max(0, s.fail_next - 1)
            # Echo the caller's credentials, as some real APIs do, to test that clients redact them.
            return body, web.json_response({"error": {"message": f"scripted failure for {auth}"}}, status=status)
        return body, None

    async def chat(self, request: web.Request) -> web.Response:
        body, failed = await self._gate(request)
        if failed:
            return failed
        choices = []
        for i in range(body.get("n", 1)):
            text = self.script.replies[next(self._counter) % len(self.script.replies)]
            choices.append({"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"})
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": choices, "usage": usage})

    async def completions(self, request: web.Request) -> web.Response:
        body, failed = await self._gate(request)
        if failed:
            return failed
        ids, max_tokens = list(body["prompt"]), body.get("max_tokens", 16)
        if max_tokens == 0 and self.script.reject_max_tokens_zero:
            return web.json_response({"error": {"message": "max_tokens must be at least 1"}}, status=400)
        ids += [7] * max_tokens  # "generated" tokens
        lps = [None] + [self.script.logprob(i, t) for i, t in enumerate(ids) if i > 0]
        logprobs = {"tokens": [str(t) for t in ids], "token_logprobs": lps, "top_logprobs": None,
                    "text_offset": list(range(len(ids)))}
        choice = {"index": 0, "text": "", "logprobs": logprobs, "finish_reason": "length"}
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": max_tokens,
                 "total_tokens": len(ids)}
        return web.json_response({"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                                  "choices": [choice], "usage": usage})

    async def tokenize(self, request: web.Request) -> web.Response:
        body, failed = await self._gate(request)
        if failed:
            return failed
        if self.script.tokenize is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        tokens = self.script.tokenize(body["prompt"])
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 512})

    def start(self) -> FakeJudge:
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self.chat)
            app.router.add_post("/v1/completions", self.completions)
            app.router.add_post("/tokenize", self.tokenize)
            self._runner = web.AppRunner(app, shutdown_timeout=0.1)  # "killed": do not wait for handlers
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
            ready.set()

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        if not ready.wait(10):
            raise RuntimeError("fake judge did not start")
        return self

    def stop(self) -> None:
        """Kill the server: open connections are cut, new ones are refused."""
        if self._loop is None:
            return
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> FakeJudge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
