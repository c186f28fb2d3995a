"""`SleepGate`: holds requests back while the engine sleeps (its GPU lent to a training run).

States: awake (requests pass) -> closed (new requests wait; the ones in flight finish: `close` waits for
them, bounded) -> asleep -> awake again (`open`). A waiting request passes as soon as the gate opens; after
`wait_s` it is refused with a 503 that carries Retry-After, so a client (the OpenAI and Anthropic SDKs
retry 503 by themselves) comes back later instead of failing inside vLLM. No vLLM, no Ray here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from serve.protocol import EngineRequestError

WAIT_S = 30.0  # how long a request waits for the engine to wake before it is refused
RETRY_AFTER_S = 30  # what the refusal's Retry-After says
DRAIN_S = 120.0  # how long `close` waits for requests in flight; vLLM aborts what is left after it


class SleepGate:
    def __init__(self, wait_s: float = WAIT_S, drain_s: float = DRAIN_S,
                 retry_after_s: int = RETRY_AFTER_S) -> None:
        self.wait_s, self.drain_s, self.retry_after_s = wait_s, drain_s, retry_after_s
        self.asleep = False  # set by the engine once vLLM sleeps, cleared once it woke
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()  # no request in flight
        self._idle.set()
        self._inflight = 0

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """One request's passage: waits while the gate is closed (up to `wait_s`, then a 503)."""
        if not self._open.is_set():
            try:
                await asyncio.wait_for(self._open.wait(), self.wait_s)
            except TimeoutError:
                raise EngineRequestError(
                    503, "the engine is paused while the model trains on its GPU; retry shortly",
                    "server_error", retry_after_s=self.retry_after_s) from None
        self._inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def close(self) -> bool:
        """Stop admitting, then wait until the requests in flight are done (up to `drain_s`). Returns
        whether they all finished."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), self.drain_s)
        except TimeoutError:
            return False
        return True

    def open(self) -> None:
        self._open.set()
