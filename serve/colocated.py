"""Co-located mode (`proxy.colocate: true`): the Proxy's routes and the engine in ONE replica.

The Proxy code is unchanged; its engine is a `LocalHandle` over an in-process `PolicyEngineImpl` (or
`UpstreamEngineImpl`) instead of a deployment handle, so a request crosses no Ray hop between ingress and
engine. On a 2-core machine that hop costs more CPU than everything clawray does per request
(benchmarks/proxy_overhead.py). vLLM's engine core still runs in its own process, as in `vllm serve`.

The deployment keeps the engine's stable name `PolicyEngine`: callers that find the engine by name (the
trainer's publish) call `load_adapter` / `activate` / ... on it as on the two-deployment layout. Costs of
this mode: a Proxy restart restarts vLLM, and proxy and engine replicas scale together.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ray import serve

from core import names
from serve.local_handle import LocalHandle
from serve.metrics import EngineMetrics
from serve.protocol import Reply
from serve.proxy import Proxy


def _relayed(method: str):
    """An async-generator method streaming `self.policy.<method>(body)`; when the caller stops early (a
    cancelled handle call) it closes the engine's generator at once, whose `finally` unpins the adapter
    and aborts the vLLM request (not at garbage collection)."""

    async def relay(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        gen = getattr(self.policy, method)(body)
        try:
            async for item in gen:
                yield item
        finally:
            await gen.aclose()

    relay.__name__ = relay.__qualname__ = method
    return relay


class ColocatedEngine(Proxy.func_or_class):
    async def __init__(self, backend: str, engine_args: tuple, proxy: dict, skills: dict, storage_root: str,
                       sink_actors: list[str] | None = None, memory: dict | None = None,
                       state: dict | None = None, blob_root: str | None = None,
                       namespace: str = names.DEFAULT_NAMESPACE, context: dict | None = None):
        if backend == "upstream":
            from serve.upstream import UpstreamEngineImpl

            self.policy = UpstreamEngineImpl(*engine_args)
        else:
            from serve.engine import PolicyEngineImpl

            self.policy = PolicyEngineImpl(*engine_args)
        self.policy.metrics = EngineMetrics(backend)
        if hasattr(self.policy, "start"):
            await self.policy.start()
        await super().__init__(LocalHandle(self.policy), proxy, skills, storage_root, sink_actors, memory, state,
                               blob_root, namespace, context)

    # ---- the engine's handle methods, for callers that find `PolicyEngine` by name ----------------------
    # All of them, so this deployment is a drop-in `PolicyEngine`: the trainer's publish finds it by name,
    # and more `Proxy` replicas can still be put in front of it (scaling ingress past the engine replicas).

    async def chat(self, body: dict[str, Any]) -> Reply:
        return await self.policy.chat(body)

    async def messages(self, body: dict[str, Any]) -> Reply:
        return await self.policy.messages(body)

    async def responses(self, body: dict[str, Any]) -> Reply:
        return await self.policy.responses(body)

    chat_stream = _relayed("chat_stream")
    messages_stream = _relayed("messages_stream")
    responses_stream = _relayed("responses_stream")

    async def complete(self, body: dict[str, Any]) -> Reply:  # the Controller's re-sampled groups
        return await self.policy.complete(body)

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.policy.count_tokens(body)

    async def models(self) -> dict[str, Any]:
        return await self.policy.models()

    async def load_adapter(self, name: str, path: str | None = None) -> dict[str, Any]:
        return await self.policy.load_adapter(name, path)

    async def activate(self, name: str | None) -> dict[str, Any]:
        return await self.policy.activate(name)

    async def publish(self, name: str) -> dict[str, Any]:
        return await self.policy.publish(name)

    async def unload(self, name: str) -> dict[str, Any]:
        return await self.policy.unload(name)

    async def adapters(self) -> dict[str, Any]:
        return await self.policy.adapters()

    async def sleep(self) -> dict[str, Any]:  # the Controller's, around runs on a shared GPU
        return await self.policy.sleep()

    async def wake_up(self) -> dict[str, Any]:
        return await self.policy.wake_up()

    async def is_sleeping(self) -> bool:
        return await self.policy.is_sleeping()

    async def check_health(self) -> None:
        vllm = getattr(self.policy, "vllm", None)
        if vllm is not None:
            await vllm.client.check_health()


Colocated = serve.deployment(name=names.ENGINE, max_ongoing_requests=256, health_check_period_s=10)(
    ColocatedEngine)
