"""`LocalHandle` behaves like the slice of a Serve DeploymentHandle the Proxy uses (co-located mode)."""

from __future__ import annotations

import asyncio

from serve.local_handle import LocalHandle


class Engine:
    def __init__(self) -> None:
        self.closed = False

    async def chat(self, body: dict) -> str:
        return f"reply to {body['q']}"

    async def chat_stream(self, body: dict):
        try:
            for i in range(100):
                yield f"chunk {i}"
                await asyncio.sleep(0)
        finally:
            self.closed = True  # the engine's cleanup (unpin the adapter, abort the request)


def test_remote_calls_and_streams_run_in_process():
    engine = Engine()
    handle = LocalHandle(engine)

    async def run():
        reply = await handle.chat.remote({"q": "x"})
        gen = handle.options(stream=True).chat_stream.remote({})
        first = [await gen.__anext__() for _ in range(3)]
        return reply, first

    assert asyncio.run(run()) == ("reply to x", ["chunk 0", "chunk 1", "chunk 2"])


def test_cancel_closes_the_engine_generator():
    engine = Engine()

    async def run():
        gen = LocalHandle(engine).options(stream=True).chat_stream.remote({})
        await gen.__anext__()
        gen.cancel()
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(run())
    assert engine.closed


def test_private_names_are_not_forwarded():
    import pytest

    with pytest.raises(AttributeError):
        _ = LocalHandle(Engine())._secret
