"""`UpstreamEngine`: the engine role played by any external OpenAI-compatible API (skills-only mode with a
hosted model). Same methods as `PolicyEngine` (serve/protocol.py `Engine`), so the Proxy does not change.

- The upstream gets only the request body (clawray's headers and body fields never leave the Proxy), the
  configured model name, and `Authorization: Bearer <engine.upstream key>` when a key env var is set.
- Capture: see serve/upstream_wire.py (logprobs when offered, vLLM token ids when the upstream is vLLM).
- Errors become clear client errors: the upstream's own 4xx message (key redacted, capped), 502 for its
  failures, 504 for timeouts; never a stack trace, never the key, never the upstream's URL.
- Anthropic `/v1/messages` is translated to chat completions with vLLM's converters; `count_tokens` and
  the adapter (LoRA) methods are refused: there is no local tokenizer or engine to apply them to.
- OpenAI Responses (`/v1/responses`) is refused with a 501: its items and events would need a translation
  to and from chat completions (with tool calls and capture) that this mode does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
from pydantic_core import from_json, to_json
from ray import serve

from core import names
from core.config import EngineConfig, ModelConfig
from serve.metrics import EngineMetrics
from serve.protocol import EngineRequestError, Reply
from serve.upstream_wire import (
    Asked,
    Caps,
    StreamCapture,
    anthropic_events,
    anthropic_to_openai,
    capture_body,
    cut_prompt_ids,
    error_message,
    openai_to_anthropic,
    role_chunk,
    sse_data,
    strip_body,
    strip_chunk,
    top_level_cut,
    upstream_payload,
)

log = logging.getLogger("clawray.upstream")
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})  # transient: the same request may succeed
CLIENT_STATUSES = frozenset({400, 404, 409, 413, 422})
MAX_BACKOFF_S = 8.0


class UpstreamEngineImpl:
    def __init__(self, model: dict, engine: dict):
        self.model_cfg = ModelConfig.model_validate(model)
        self.engine_cfg = EngineConfig.model_validate(engine)
        if self.engine_cfg.upstream is None:
            raise ValueError("engine.upstream must be set when engine.backend is 'upstream'")
        self.ep = self.engine_cfg.upstream
        key = self.ep.api_key()
        self._secrets = [key] if key else []
        self._url = self.ep.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        # httpx.Timeout(t) semantics: waiting for a pooled connection + connecting, and each read, <= t.
        t = self.ep.timeout_s
        self._timeout = aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self.caps = Caps()
        self.metrics: EngineMetrics | None = None

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool, made on first use: an aiohttp session belongs to its event loop (the
        replica's; a test's `asyncio.run` gets its own). aiohttp, not httpx: its client costs a fraction of
        httpx's CPU per request (benchmarks/whole_path.py), which on a few cores is the proxy's throughput.
        `max_concurrency` caps the connections (a provider's rate limit); requests beyond it wait."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session_loop is not loop or self._session.closed:
            self._session_loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.ep.max_concurrency, limit_per_host=0),
                timeout=self._timeout, headers=self._headers)
        return self._session

    # ---- the Engine protocol ----------------------------------------------------------------------

    async def chat(self, body: dict[str, Any]) -> Reply:
        payload, asked = upstream_payload(body, self.ep.model, self.caps)
        with self._counted():
            data, prompt_json = await self._json(payload, asked)
        cap = capture_body(data, prompt_json)  # before strip_body removes what it reads
        return Reply(strip_body(data, asked), cap, body["messages"])

    async def chat_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        payload, asked = upstream_payload(body, self.ep.model, self.caps)
        acc = StreamCapture()
        with self._counted():
            resp = await self._send(payload, asked)  # errors raise here, before the first item
            try:
                async for data in self._chunks(resp, acc):
                    if data is None:
                        break
                    chunk, raw = data
                    yield f"data: {json.dumps(chunk) if strip_chunk(chunk, asked) else raw}\n\n"
            finally:
                resp.release()
        yield "data: [DONE]\n\n"
        yield Reply({}, acc.capture(), body["messages"])

    async def messages(self, body: dict[str, Any]) -> Reply:
        oai, messages = anthropic_to_openai(body)
        payload, asked = upstream_payload(oai, self.ep.model, self.caps)
        with self._counted():
            data, prompt_json = await self._json(payload, asked)
        cap = capture_body(data, prompt_json)
        return Reply(openai_to_anthropic(data), cap, messages)

    async def messages_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        oai, messages = anthropic_to_openai(body)
        payload, asked = upstream_payload(oai, self.ep.model, self.caps)
        acc = StreamCapture()
        with self._counted():
            resp = await self._send(payload, asked)

            async def openai_sse() -> AsyncIterator[str]:
                first = True
                async for data in self._chunks(resp, acc):
                    if data is None:
                        break
                    if first:
                        first = False
                        yield role_chunk(data[0])
                    yield f"data: {data[1]}\n\n"
                yield "data: [DONE]\n\n"

            try:
                async for event in anthropic_events(openai_sse()):
                    yield event
            finally:
                resp.release()
        yield Reply({}, acc.capture(), messages)

    @contextlib.contextmanager
    def _counted(self):
        if self.metrics is not None:
            self.metrics.begin()
        try:
            yield
        finally:
            if self.metrics is not None:
                self.metrics.end()

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        raise EngineRequestError(501, "count_tokens is not available in upstream mode (no local tokenizer)",
                                 "not_supported_error")

    async def complete(self, body: dict[str, Any]) -> Reply:
        raise EngineRequestError(501, "token-id completions (re-sampled GRPO groups) need the local engine, "
                                 "not upstream mode", "not_supported_error")

    async def responses(self, body: dict[str, Any]) -> Reply:
        raise _no_responses()

    async def responses_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        raise _no_responses()
        yield  # an async generator, as the Engine protocol's streams are: the refusal comes at the first item

    async def models(self) -> dict[str, Any]:
        return {"base": self.ep.model, "alias": self.model_cfg.policy_alias, "active": None, "loaded": [],
                "max_model_len": None}

    async def adapters(self) -> dict[str, Any]:
        return {"base": self.ep.model, "alias": self.model_cfg.policy_alias, "active": None, "loaded": [],
                "retiring": [], "inflight": {}}

    async def load_adapter(self, name: str, path: str | None = None) -> dict[str, Any]:
        raise self._no_adapters()

    async def activate(self, name: str | None) -> dict[str, Any]:
        raise self._no_adapters()

    async def publish(self, name: str) -> dict[str, Any]:
        raise self._no_adapters()

    async def unload(self, name: str) -> dict[str, Any]:
        raise self._no_adapters()

    @staticmethod
    def _no_adapters() -> EngineRequestError:
        return EngineRequestError(409, "LoRA adapters cannot be served in upstream mode "
                                       "(engine.backend: upstream); use engine.backend: vllm", "conflict_error")

    # ---- HTTP ---------------------------------------------------------------------------------------

    async def _json(self, payload: dict[str, Any], asked: Asked) -> tuple[dict[str, Any], bytes | None]:
        """The upstream's reply parsed, and its prompt ids' JSON text when they were cut out before parsing
        (upstream_wire.cut_prompt_ids: the client did not ask for them, so they only go to the store)."""
        resp = await self._send(payload, asked)
        try:
            raw = await resp.read()
        except TimeoutError:
            raise EngineRequestError(504, "the upstream model did not answer in time", "upstream_error") from None
        except aiohttp.ClientError as e:
            log.warning("upstream reply broke off: %s", type(e).__name__)
            raise EngineRequestError(502, "the upstream reply broke off", "upstream_error") from None
        finally:
            resp.release()
        cut = None if asked.token_ids else cut_prompt_ids(raw)
        try:
            data = from_json(raw if cut is None else cut[0])  # pydantic's Rust parser: ~3x json.loads
            if cut is not None and not top_level_cut(data):
                data, cut = from_json(raw), None
        except ValueError:
            raise EngineRequestError(502, "the upstream sent a reply that is not JSON", "upstream_error") from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise EngineRequestError(502, "the upstream sent a reply without choices", "upstream_error")
        return data, None if cut is None else cut[1]

    async def _send(self, payload: dict[str, Any], asked: Asked) -> aiohttp.ClientResponse:
        """POST chat/completions; returns the open 200 response (caller releases it) or raises a mapped
        `EngineRequestError`. Retries transport errors and 429/5xx with backoff, and once per optional
        capture field the upstream refuses."""
        attempt = 0
        while True:
            try:
                resp = await self._http().post(self._url, data=to_json(payload))
            except TimeoutError:  # aiohttp's timeouts are TimeoutErrors (and some also ClientErrors)
                err = EngineRequestError(504, "the upstream model did not answer in time", "upstream_error")
            except aiohttp.ClientError as e:
                log.warning("upstream unreachable: %s", type(e).__name__)
                err = EngineRequestError(502, "the upstream model is unreachable", "upstream_error")
            else:
                if resp.status == 200:
                    return resp
                try:
                    text = (await resp.read()).decode("utf-8", "replace")
                except (TimeoutError, aiohttp.ClientError):
                    text = ""
                finally:
                    resp.release()
                message = error_message(text, self._secrets)
                if resp.status == 400 and self.caps.refused(message, asked):
                    log.info("upstream refuses a capture field; continuing without it (%s)", self.caps)
                    payload = _without_refused(payload, self.caps, asked)
                    continue
                err = self._mapped(resp.status, message)
                if resp.status not in RETRY_STATUSES:
                    raise err
            if attempt >= self.ep.max_retries:
                raise err
            await asyncio.sleep(min(self.ep.backoff_s * 2**attempt, MAX_BACKOFF_S))
            attempt += 1

    def _mapped(self, status: int, message: str) -> EngineRequestError:
        log.warning("upstream answered HTTP %d", status)
        log.debug("upstream error message: %s", message)
        if status in CLIENT_STATUSES:
            return EngineRequestError(status, f"the upstream model refused the request: {message}")
        if status in (401, 403):  # our credentials, not the client's: do not answer 401 to the client
            return EngineRequestError(502, "the upstream model refused clawray's credentials "
                                           "(engine.upstream.api_key_env)", "upstream_error")
        if status == 429:
            return EngineRequestError(429, "the upstream model is rate limiting; retry later", "rate_limit_error")
        return EngineRequestError(502, f"the upstream model failed (HTTP {status})", "upstream_error")

    async def _chunks(self, resp: aiohttp.ClientResponse, acc: StreamCapture):
        """Parsed stream chunks `(chunk, raw)`, folded into `acc`; None at the upstream's [DONE]."""
        try:
            async for raw in sse_data(_lines(resp.content)):
                if raw.strip() == "[DONE]":
                    yield None
                    return
                try:
                    chunk = json.loads(raw)
                except ValueError:
                    raise EngineRequestError(502, "the upstream sent an invalid stream", "upstream_error") from None
                acc.feed(chunk)
                yield chunk, raw
        except TimeoutError:
            raise EngineRequestError(504, "the upstream model stopped answering mid-stream",
                                     "upstream_error") from None
        except aiohttp.ClientError as e:
            log.warning("upstream stream broke: %s", type(e).__name__)
            raise EngineRequestError(502, "the upstream stream broke off", "upstream_error") from None


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The lines of a response body, without their breaks, however long: aiohttp's own line reader
    refuses lines over its buffer size, and a vLLM stream's first chunk carries every prompt token id."""
    parts: list[bytes] = []
    async for chunk in content.iter_any():
        while (i := chunk.find(b"\n")) >= 0:
            parts.append(chunk[:i])
            yield b"".join(parts).rstrip(b"\r").decode("utf-8", "replace")
            parts, chunk = [], chunk[i + 1:]
        if chunk:
            parts.append(chunk)
    if parts:
        yield b"".join(parts).rstrip(b"\r").decode("utf-8", "replace")


def _no_responses() -> EngineRequestError:
    return EngineRequestError(501, "the Responses API (/v1/responses) is not available in upstream mode "
                                   "(engine.backend: upstream); use /v1/chat/completions", "not_supported_error")


def _without_refused(payload: dict[str, Any], caps: Caps, asked: Asked) -> dict[str, Any]:
    payload = dict(payload)
    if not caps.token_ids and not asked.token_ids:
        payload.pop("return_token_ids", None)
    if not caps.logprobs and not asked.logprobs:
        payload.pop("logprobs", None)
    return payload


@serve.deployment(name=names.ENGINE, max_ongoing_requests=256, health_check_period_s=10)
class UpstreamEngine(UpstreamEngineImpl):
    """Deployed under the engine's stable name `PolicyEngine`, so callers that find the engine by name
    (the trainer's publish, the CLI) reach it and get a clear refusal for adapter operations."""

    def __init__(self, model: dict, engine: dict):
        UpstreamEngineImpl.__init__(self, model, engine)
        self.metrics = EngineMetrics("upstream")

    async def check_health(self) -> None:
        pass  # an unreachable upstream is reported per request (502); restarting us would not fix it
