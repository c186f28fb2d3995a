"""Helpers shared by the integration tests: polling, reading a storage root's session store, real peft
LoRA adapters for the tiny model published the way the trainer publishes them, and a seal barrier that
holds a training step at its commit point until the test lets it go."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path


def wait_for(pred, timeout: float, every: float = 0.5):
    """`pred()`'s first truthy value within `timeout` seconds, else None."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    return None


def session_turns(root: str | Path, session_id: str | None = None) -> list:
    """The turns in `root`'s session store (one session's, or all), read with a fresh connection."""
    from serve.sessions import SessionStore

    store = SessionStore(Path(root) / "sessions" / "sessions.db")
    try:
        return store.turns(session_id)
    finally:
        store.close()


def app_turns(serve_app: dict, session_id: str) -> list:
    """The stored turns of session `session_id` of the suite's system (the `serve_app` fixture)."""
    return session_turns(serve_app["config"].storage_path(), session_id)


def publish_adapters(model_path: str, adapters: Path, count: int, rank: int = 8) -> list[str]:
    """Write `count` new versions `policy-vNNNN` (after the highest present), each with random non-zero
    lora_B so it changes the logprobs, plus its manifest; each folder appears atomically (rename)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from core.contracts import AdapterManifest, adapter_name, parse_adapter_name
    from core.storage import atomic_write_json

    adapters.mkdir(parents=True, exist_ok=True)
    present = [parse_adapter_name(p.name) for p in adapters.iterdir() if p.name.startswith("policy-v")]
    base = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(base, cfg)
    names = []
    for version in range(max(present, default=0) + 1, max(present, default=0) + 1 + count):
        torch.manual_seed(version)
        with torch.no_grad():  # new weights per version (peft inits lora_B to zero: no effect otherwise)
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.5)
        name, tmp = adapter_name(version), adapters / f".tmp-{uuid.uuid4().hex}"
        model.save_pretrained(str(tmp))
        atomic_write_json(tmp / "manifest.json", AdapterManifest(
            name=name, version=version, base_model=model_path, rank=rank, alpha=2.0 * rank,
            target_modules=["q_proj", "v_proj"], step=version, skill_generation=0).model_dump(mode="json"))
        os.rename(tmp, adapters / name)
        names.append(name)
    return names


def make_seal_barrier(ray, name: str, hold_at: int = 1, namespace: str = "clawray"):
    """A named actor for a training run's `test_hooks["before_seal"]` (train/grpo.py): rank 0 awaits
    `before_seal(info)` right before each step's seal; the `hold_at`-th arrival (1-based) blocks until the
    test calls `release()`, every other arrival passes. So a test decides, without sleeps, what happens
    while a step holds its gradients but has not committed its samples."""

    @ray.remote(num_cpus=0)
    class SealBarrier:
        def __init__(self):
            self.arrivals: list[dict] = []
            self.held, self.go = asyncio.Event(), asyncio.Event()

        async def before_seal(self, info: dict) -> None:
            self.arrivals.append(info)
            if len(self.arrivals) == hold_at:
                self.held.set()
                await self.go.wait()

        async def held_arrival(self) -> dict:
            """The held arrival's info, once it has arrived."""
            await self.held.wait()
            return self.arrivals[hold_at - 1]

        async def release(self) -> None:
            self.go.set()

        async def count(self) -> int:
            return len(self.arrivals)

    return SealBarrier.options(name=name, namespace=namespace).remote()
