"""Types that cross the Proxy <-> engine boundary (no vLLM, no Ray imports).

Two engine deployments implement `Engine`: `PolicyEngine` (vLLM in-process, serve/engine.py) and
`UpstreamEngine` (any external OpenAI-compatible API, serve/upstream.py). The Proxy only calls these
methods through a deployment handle, so either engine (or a fake one in benchmarks) can stand behind it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

from serve.capture import Capture


class EngineRequestError(Exception):
    """A request the engine refused; carries the HTTP status and an OpenAI-style error body, and for a
    refusal that passes (the engine sleeps while a run trains) the seconds after which to retry."""

    def __init__(self, status: int, message: str, err_type: str = "invalid_request_error",
                 retry_after_s: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.retry_after_s = retry_after_s

    def __reduce__(self):  # keep status/type when Ray ships the exception to the caller
        return (type(self), (self.status, self.message, self.err_type, self.retry_after_s))


@dataclass
class Reply:
    """A reply: the client-ready JSON body (empty after a stream) plus what the engine captured."""

    body: dict[str, Any]
    capture: Capture
    messages: list[dict[str, Any]]  # the conversation the engine rendered, OpenAI format


class Engine(Protocol):
    """What the Proxy calls on the engine deployment. Streams yield SSE strings, then one final `Reply`
    (body empty). Request errors raise `EngineRequestError` before the first item."""

    async def chat(self, body: dict[str, Any]) -> Reply: ...

    def chat_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]: ...

    async def messages(self, body: dict[str, Any]) -> Reply: ...

    def messages_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]: ...

    async def responses(self, body: dict[str, Any]) -> Reply:
        """OpenAI Responses (`POST /v1/responses`); `Reply.messages` is its input as chat messages."""

    def responses_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]: ...

    async def complete(self, body: dict[str, Any]) -> Reply:
        """OpenAI completions on token ids (`prompt`: [ids], `n`): training windows' re-sampled groups."""

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def models(self) -> dict[str, Any]:
        """{"base", "alias", "active", "loaded", "max_model_len"}."""

    async def load_adapter(self, name: str, path: str | None = None) -> dict[str, Any]: ...

    async def activate(self, name: str | None) -> dict[str, Any]: ...

    async def publish(self, name: str) -> dict[str, Any]: ...

    async def unload(self, name: str) -> dict[str, Any]: ...

    async def adapters(self) -> dict[str, Any]: ...
