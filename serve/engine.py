"""`PolicyEngine`: the Ray Serve deployment that hosts vLLM and owns the LoRA versions.

Every request resolves its adapter once, at its start (the active version, a pinned version, or the
base), and keeps it to the end: activation is a single assignment, so a hot-swap never touches an
in-flight request (DESIGN.md "Serving never waits for training"). The active version is also written to
the storage root's active pointer (with the last `adapter_retention` activated versions), from which every
replica (and a restarted one) reconciles within a second.

Where versions live is core/adapter_store.py's business: `adapters/` under a local storage root, or
object storage (`blob_root`, e.g. `s3://bucket/prefix`), from which each replica copies a version into a
local cache folder before vLLM loads it (vLLM needs a local path).

Unloading a retired version is cleanup: a failure is logged, the version stays retiring (never handed
out) and the reconcile loop retries; it never turns a finished reply into an error. After each
activation and each unload, versions outside `adapter_disk_retention` and stale temp folders are
deleted (from the bucket and the local cache too) by the rule in core/storage.py `adapters_to_remove`
(never the active version, a recently activated one, or one this replica still has loaded).

Sleep mode (`engine.share_gpu_with_training: sleep`, one GPU shared with the trainer): `sleep` lets the
requests in flight finish, holds new ones at a gate (serve/sleep_gate.py: they wait, then get a 503 with
Retry-After) and puts vLLM to sleep; while it sleeps a published version is only written to the active
pointer; `wake_up` wakes vLLM, loads and activates what the pointer names, then opens the gate. The
Controller calls both around its runs (cluster/gpu_share.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ray import serve

from core import names
from core.adapter_store import adapter_store
from core.config import EngineConfig, ModelConfig
from core.storage import StorageLayout
from serve.adapters import AdapterRegistry
from serve.metrics import EngineMetrics
from serve.protocol import EngineRequestError, Reply
from serve.sleep_gate import SleepGate

log = logging.getLogger("clawray.engine")


class PolicyEngineImpl:
    """The deployment's logic, kept apart from the decorator so it can be tested and composed."""

    def __init__(self, model_path: str, model: dict, engine: dict, storage_root: str,
                 blob_root: str | None = None):
        """`storage_root`: the local storage root (`ClawrayConfig.storage_path()`); `blob_root`: the
        object-storage root when adapters live there (`ClawrayConfig.blob_root()`)."""
        from serve.vllm_engine import VLLMServing

        self.model_cfg = ModelConfig.model_validate(model)
        self.engine_cfg = EngineConfig.model_validate(engine)
        self.layout = StorageLayout(Path(storage_root), blob_root=blob_root).ensure()
        self.store = adapter_store(self.layout)
        self.vllm = VLLMServing(model_path, self.model_cfg, self.engine_cfg)
        self.reg = AdapterRegistry(
            self.model_cfg.served_name, self.model_cfg.policy_alias, self.engine_cfg.adapter_retention
        )
        self._lock = asyncio.Lock()  # serialises load/activate/unload
        self._unloading: set[str] = set()  # removals in progress (a retry must not start a second one)
        self._pointer_token: object = None  # the pointer as this replica last saw or wrote it
        self._reconciler: asyncio.Task | None = None
        self.metrics: EngineMetrics | None = None  # set by the deployment (needs a Ray worker)
        self.gate = SleepGate()  # holds requests back while vLLM sleeps (engine.share_gpu_with_training)
        self._sleep_lock = asyncio.Lock()  # serialises sleep and wake-up

    async def start(self) -> None:
        await self.vllm.start()
        await self._reconcile()
        self._reconciler = asyncio.get_running_loop().create_task(self._reconcile_loop())

    # ---- requests ---------------------------------------------------------------------------

    def _pin(self, body: dict[str, Any]) -> str | None:
        name = self.reg.resolve(body.get("model"))
        body["model"] = name or self.model_cfg.served_name
        self.reg.begin(name)
        if self.metrics is not None:
            self.metrics.begin()
        return name

    async def _done(self, name: str | None) -> None:
        if self.metrics is not None:
            self.metrics.end()
        for victim in self.reg.end(name):
            await self._unload_quietly(victim)

    # Each request passes the sleep gate before it resolves its adapter: one that waited while vLLM slept
    # gets the adapter activated at wake-up.

    @asynccontextmanager
    async def _admitted(self, body: dict[str, Any]) -> AsyncIterator[None]:
        """Around one request: through the sleep gate, its adapter pinned until it is done."""
        async with self.gate.admit():
            name = self._pin(body)
            try:
                yield
            finally:
                await self._done(name)

    async def chat(self, body: dict[str, Any]) -> Reply:
        async with self._admitted(body):
            return await self.vllm.chat(body)

    async def messages(self, body: dict[str, Any]) -> Reply:
        async with self._admitted(body):
            return await self.vllm.messages(body)

    async def responses(self, body: dict[str, Any]) -> Reply:
        async with self._admitted(body):
            return await self.vllm.responses(body)

    async def chat_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        async with self._admitted(body):
            async for item in self.vllm.chat_stream(body):
                yield item

    async def messages_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        async with self._admitted(body):
            async for item in self.vllm.messages_stream(body):
                yield item

    async def responses_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        async with self._admitted(body):
            async for item in self.vllm.responses_stream(body):
                yield item

    async def complete(self, body: dict[str, Any]) -> Reply:
        """Token-id completions with the active adapter (train/rollouts.py; no HTTP route)."""
        async with self._admitted(body):
            return await self.vllm.complete(body)

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        body["model"] = self.model_cfg.served_name
        return await self.vllm.count_tokens(body)

    async def models(self) -> dict[str, Any]:
        snap = self.reg.snapshot()
        return {
            "base": self.model_cfg.served_name,
            "alias": self.model_cfg.policy_alias,
            "active": snap["active"],
            "loaded": snap["loaded"],
            "max_model_len": self.model_cfg.max_model_len,
        }

    # ---- versioned LoRA -------------------------------------------------------------------------

    async def _path(self, name: str, given: str | None) -> Path:
        """The version's local folder (on object storage: copied into the local cache first); never an
        arbitrary path from a caller."""
        try:
            return await asyncio.to_thread(self.store.folder, name, given)
        except ValueError as e:
            raise EngineRequestError(400, str(e)) from None
        except LookupError as e:
            raise EngineRequestError(404, str(e)) from None

    async def load_adapter(self, name: str, path: str | None = None) -> dict[str, Any]:
        """Load a published version by name (from the storage root's adapters). Idempotent.

        `path` (what the trainer passes: the version's folder, or the URI of its files on object
        storage) must be where the storage root has it; it is checked, not trusted. While vLLM sleeps
        nothing is loaded: what `activate` names then is loaded at wake-up.
        """
        path = await self._path(name, path)
        async with self._lock:
            if self.gate.asleep:
                return {**self.reg.snapshot(), "deferred": name}
            if name not in self.reg.loaded or name in self.reg.retiring:
                await self.vllm.add_lora(name, str(path))
                self.reg.add(name, str(path))
        return self.reg.snapshot()

    async def activate(self, name: str | None) -> dict[str, Any]:
        """Make `name` (None = base model) what new requests get; older versions beyond retention go."""
        if name is not None and name not in self.reg.loaded:
            await self.load_adapter(name)
        async with self._lock:
            if self.gate.asleep:  # the pointer says what to serve; `wake_up` loads and activates it
                await self._write_pointer(name)
                return {**self.reg.snapshot(), "deferred": name}
            try:
                self.reg.activate(name)
            except KeyError as e:
                raise EngineRequestError(404, str(e)) from None
            await self._write_pointer(name)
            for victim in self.reg.over_retention():
                if self.reg.retire(victim):
                    await self._unload_quietly(victim)
            await self._prune_folders()
            snap = self.reg.snapshot()
        if self.metrics is not None:
            self.metrics.adapters(name, len(snap["loaded"]))
        log.info("active adapter: %s", name or "<base>")
        return snap

    async def publish(self, name: str) -> dict[str, Any]:
        """Load and activate a freshly published version (what the trainer calls)."""
        await self.load_adapter(name)
        return await self.activate(name)

    async def unload(self, name: str) -> dict[str, Any]:
        async with self.gate.admit(), self._lock:  # not in a sleeping vLLM: waits for the wake-up
            try:
                ready = self.reg.retire(name)
            except KeyError as e:
                raise EngineRequestError(404, str(e)) from None
            except ValueError as e:
                raise EngineRequestError(409, str(e)) from None
            for victim in ready:
                await self._remove(victim)
        return self.reg.snapshot()

    async def adapters(self) -> dict[str, Any]:
        return self.reg.snapshot()

    async def _write_pointer(self, name: str | None) -> None:
        """The active pointer: the active version and the versions activated last (any replica may still
        serve those, so their files stay)."""
        await asyncio.to_thread(self.store.set_active, name, self.engine_cfg.adapter_retention)
        self._pointer_token = await asyncio.to_thread(self.store.pointer_token)

    async def _remove(self, name: str) -> None:
        self._unloading.add(name)
        try:
            await self.vllm.remove_lora(name)
        finally:
            self._unloading.discard(name)
        self.reg.forget(name)
        await self._prune_folders()

    async def _unload_quietly(self, name: str) -> None:
        """`_remove`, for cleanup paths: a failure leaves `name` retiring for `_retry_unloads`."""
        try:
            await self._remove(name)
        except Exception as e:  # noqa: BLE001 - cleanup after a finished reply or activation must not fail it
            log.warning("unloading retired adapter %s failed (retried within a second): %s", name, e)

    async def _retry_unloads(self) -> None:
        """Unload retiring versions that no request uses any more (an earlier unload failed)."""
        for name in sorted(self.reg.retiring):
            if not self.reg.inflight.get(name) and name not in self._unloading:
                await self._unload_quietly(name)

    async def _prune_folders(self) -> None:
        """Delete versions outside retention and stale temp folders (core/storage.py's rule)."""
        pointer = await asyncio.to_thread(self.store.read_active)
        keep = set(self.reg.loaded) | set(pointer.get("recent", [])) | {self.reg.active, pointer.get("active")}
        gone = await asyncio.to_thread(self.store.prune, keep - {None}, self.engine_cfg.adapter_disk_retention)
        if gone:
            log.info("removed adapter folders outside retention: %s", ", ".join(gone))

    async def _reconcile(self) -> None:
        """Follow the active pointer (another replica, or our previous life, may have moved it), and
        retry unloads that failed."""
        await self._retry_unloads()
        token = await asyncio.to_thread(self.store.pointer_token)
        if token is None or token == self._pointer_token:
            return
        self._pointer_token = token
        want = (await asyncio.to_thread(self.store.read_active)).get("active")
        if want != self.reg.active:
            try:
                await self.activate(want)
            except EngineRequestError as e:
                log.warning("cannot follow active adapter %s: %s", want, e.message)

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.gate.is_open:  # not while vLLM sleeps (or is about to): `wake_up` follows the pointer
                await self._reconcile()

    # ---- sleep mode: the GPU lent to a training run (cluster/gpu_share.py) -------------------------

    async def sleep(self) -> dict[str, Any]:
        """Free the GPU for a training run: new requests wait (serve/sleep_gate.py: up to 30 s, then a 503
        with Retry-After), the ones in flight finish, then vLLM sleeps (weights to CPU memory, KV cache
        freed). Idempotent. Refused (409) when the engine was started without sleep mode."""
        if self.engine_cfg.share_gpu_with_training != "sleep":
            raise EngineRequestError(409, "this engine runs without sleep mode "
                                          "(engine.share_gpu_with_training is not 'sleep')")
        async with self._sleep_lock:
            if not self.gate.asleep:
                if not await self.gate.close():
                    log.warning("requests still in flight after %.0f s: vLLM aborts them", self.gate.drain_s)
                async with self._lock:  # no adapter load runs into the sleep
                    try:
                        await self.vllm.sleep()
                    except BaseException:
                        self.gate.open()  # still awake: serve on
                        raise
                    self.gate.asleep = True
                log.info("engine asleep: its GPU memory is free for training")
        return self.sleep_state()

    async def wake_up(self) -> dict[str, Any]:
        """Take the GPU back: vLLM wakes, the adapter activated while it slept is loaded and activated, then
        the waiting requests go through (on that adapter). Idempotent; a failed wake leaves it asleep."""
        async with self._sleep_lock:
            if self.gate.asleep:
                async with self._lock:
                    await self.vllm.wake_up()
                    self.gate.asleep = False
                self._pointer_token = None  # follow the pointer even though this replica wrote it
                await self._reconcile()
                log.info("engine awake, serving %s", self.reg.active or "<base>")
            self.gate.open()
        return self.sleep_state()

    async def is_sleeping(self) -> bool:
        return self.gate.asleep

    def sleep_state(self) -> dict[str, Any]:
        return {"asleep": self.gate.asleep, "admitting": self.gate.is_open, "active": self.reg.active}


@serve.deployment(name=names.ENGINE, max_ongoing_requests=256, health_check_period_s=10)
class PolicyEngine(PolicyEngineImpl):
    """Serve deployment; Serve awaits the async constructor before routing requests to it."""

    async def __init__(self, model_path: str, model: dict, engine: dict, storage_root: str,
                       blob_root: str | None = None):
        PolicyEngineImpl.__init__(self, model_path, model, engine, storage_root, blob_root)
        self.metrics = EngineMetrics("vllm")
        await self.start()
        self.metrics.adapters(self.reg.active, len(self.reg.loaded), swapped=False)

    async def check_health(self) -> None:
        await self.vllm.client.check_health()
