"""Types that cross the Proxy <-> PolicyEngine boundary (no vLLM, no Ray imports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve.capture import Capture


class EngineRequestError(Exception):
    """A request the engine refused; carries the HTTP status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, err_type: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type

    def __reduce__(self):  # keep status/type when Ray ships the exception to the caller
        return (type(self), (self.status, self.message, self.err_type))


@dataclass
class Reply:
    """A reply: the client-ready JSON body (empty after a stream) plus what the engine captured."""

    body: dict[str, Any]
    capture: Capture
    messages: list[dict[str, Any]]  # the conversation the engine rendered, OpenAI format
