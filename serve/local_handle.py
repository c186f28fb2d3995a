"""`LocalHandle`: the part of a Serve `DeploymentHandle` the Proxy uses, over an engine object living in the
same replica (co-located mode: no deployment-handle hop, see docs/serving.md "Co-located").

`handle.method.remote(*args)` returns an awaitable; `handle.options(stream=True).method.remote(*args)`
returns an async iterator with `cancel()`, like Serve's `DeploymentResponseGenerator`. Arguments are passed
by reference (no serialization): the engine may mutate the request body, as it does behind a real handle
on its own copy, and the Proxy does not reuse it afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


class LocalHandle:
    def __init__(self, target: Any, stream: bool = False):
        self._target, self._stream = target, stream

    def options(self, stream: bool = False, **_: Any) -> LocalHandle:
        return LocalHandle(self._target, stream)

    def __getattr__(self, name: str) -> _LocalMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _LocalMethod(getattr(self._target, name), self._stream)


class _LocalMethod:
    def __init__(self, fn: Any, stream: bool):
        self._fn, self._stream = fn, stream

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if self._stream:
            return _LocalStream(self._fn(*args, **kwargs))
        return self._fn(*args, **kwargs)  # a coroutine: awaited by the caller


class _LocalStream:
    """An async generator seen as a Serve response generator (`__anext__`, `cancel()`)."""

    def __init__(self, gen: AsyncIterator[Any]):
        self._gen = gen

    def __aiter__(self) -> _LocalStream:
        return self

    async def __anext__(self) -> Any:
        return await self._gen.__anext__()

    def cancel(self) -> None:
        # Closing runs the engine generator's `finally` (unpins its adapter, aborts the vLLM request).
        asyncio.get_running_loop().create_task(self._gen.aclose())
