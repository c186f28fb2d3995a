"""HTTP edge helpers for the Proxy: body limits, JSON parsing, auth, error bodies. No Ray, no vLLM."""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from serve.turns import RequestError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def openai_error(status: int, message: str, err_type: str | None = None) -> JSONResponse:
    err_type = err_type or ("invalid_request_error" if status < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": err_type, "code": status}}, status)


def anthropic_error(status: int, message: str) -> JSONResponse:
    kind = {
        400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
        404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    }.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)


async def read_json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, refusing bodies over `limit` bytes (413) before reading them whole."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError("invalid Content-Length header") from None
        if size > limit:
            raise RequestError(f"request body exceeds {limit} bytes", 413)
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise RequestError(f"request body exceeds {limit} bytes", 413)
    try:
        data = json.loads(bytes(buf).decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError("request body is not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"request body is not valid JSON: {e.msg} at position {e.pos}") from None
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object")
    if b"\\u" in buf and _has_lone_surrogate(data):  # only escapes can make lone surrogates
        raise RequestError("request body contains invalid Unicode (a lone surrogate escape)")
    return data


def _has_lone_surrogate(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def require_messages(body: dict[str, Any]) -> None:
    msgs = body.get("messages")
    if msgs is None:
        raise RequestError("'messages' is required")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise RequestError("'messages' must be a non-empty list of message objects")
    for i, m in enumerate(msgs):
        if not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}].role is required")


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def key_matches(presented: str | None, expected: str | None) -> bool:
    if expected is None:
        return True
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def client_fingerprint(request: Request) -> str:
    """Who is calling, for derived session ids: key fingerprint (never the key) + address + agent."""
    import hashlib

    key = presented_key(request) or ""
    kf = hashlib.sha256(key.encode()).hexdigest()[:16] if key else "-"
    host = request.client.host if request.client else "-"
    return f"{kf}|{host}|{request.headers.get('user-agent', '-')}"


def with_retry_after(response: JSONResponse, seconds: int | None) -> JSONResponse:
    """A refusal that passes (the engine sleeps while a run trains on its GPU) says when to come back."""
    if seconds is not None:
        response.headers["Retry-After"] = str(seconds)
    return response


class LastEvent(str):
    """A stream's final event (`EventStream`): sent with the end of the response."""


class EventStream(StreamingResponse):
    """Starlette's StreamingResponse, except that a `LastEvent` goes out with `more_body: False`, so uvicorn
    writes it and the chunked encoding's terminator in one write. Starlette sends the last event and then
    an empty end of body, two writes: a client that stops at the final event ([DONE]) and closes the
    connection, as Hermes does, raced the terminator, and behind HAProxy it lost (its exchanges ended cut off,
    tests/integration/test_agents_live.py), and a client that does read it waits for a second segment before
    it can reuse the connection. Hand-written: Starlette has no way to mark a body chunk as the last."""

    async def stream_response(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            last = isinstance(chunk, LastEvent)
            body = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": body, "more_body": not last})
            if last:
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:  # nothing follows the last event; let the generator finish now
                    await close()
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
