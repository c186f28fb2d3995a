"""Issue 12 item 9: adapter cleanup never breaks serving, and nothing piles up on disk.

- Removing a retired adapter from the engine is cleanup: its failure never turns a successful reply into
  an error; the version stays retiring (never handed out) and the removal is retried.
- Version folders outside retention and `.tmp-*` folders left by a crashed publish are removed, never the
  active version nor one a replica still serves (the rule: core/storage.py `adapters_to_remove`).

`PolicyEngineImpl` runs here with a fake vLLM behind it (the same methods `VLLMServing` has); the
interleavings are driven by events.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from core.config import LoRAConfig
from core.contracts import adapter_name
from core.storage import adapters_to_remove, read_json
from serve.capture import Capture
from serve.engine import PolicyEngineImpl
from serve.protocol import Reply
from train.publish import publish_adapter


class FakeVLLM:
    """`VLLMServing`'s LoRA and chat methods; chat waits for `release` so a request can be held in flight."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()
        self.fail_remove = False
        self.removed: list[str] = []

    async def add_lora(self, name: str, path: str) -> None:
        assert Path(path, "adapter_config.json").is_file()

    async def remove_lora(self, name: str) -> None:
        if self.fail_remove:
            raise RuntimeError(f"engine could not unload {name}")
        self.removed.append(name)

    async def chat(self, body: dict) -> Reply:
        self.started.set()
        await self.release.wait()
        return Reply({"model": body["model"], "choices": []}, Capture(key="k"), [])


def _publish(adapters: Path, versions: range) -> list[str]:
    for v in versions:
        folder = adapters / adapter_name(v)
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
    return [adapter_name(v) for v in versions]


def _engine(root: Path, retention: int) -> tuple[PolicyEngineImpl, FakeVLLM]:
    engine = {"adapter_retention": retention, "adapter_disk_retention": retention}
    impl = PolicyEngineImpl("unused", {}, engine, str(root))
    impl.vllm = fake = FakeVLLM()
    return impl, fake


def test_a_failed_unload_of_a_retired_adapter_never_fails_the_reply(tmp_path: Path):
    async def scenario() -> None:
        impl, fake = _engine(tmp_path, retention=1)
        v1, v2 = _publish(impl.layout.adapters, range(1, 3))
        await impl.activate(v1)
        request = asyncio.ensure_future(impl.chat({"model": "clawray-policy"}))
        await fake.started.wait()  # the request runs on v1 ...
        await impl.activate(v2)  # ... v1 leaves retention while in flight: retiring, removed at its end
        fake.fail_remove = True
        fake.release.set()
        reply = await request  # the unload fails after the reply was made
        assert reply.body["model"] == v1
        snap = impl.reg.snapshot()
        assert snap["retiring"] == [v1] and snap["loaded"] == [v2]  # never handed out again
        assert impl.reg.resolve(v1) == v2
        fake.fail_remove = False
        await impl._reconcile()  # the once-a-second reconcile retries the removal
        assert fake.removed == [v1] and impl.reg.snapshot()["retiring"] == []

    asyncio.run(scenario())


def test_folders_outside_retention_and_stale_temps_go_never_the_active_or_a_served_one(tmp_path: Path):
    async def scenario() -> None:
        impl, fake = _engine(tmp_path, retention=1)
        adapters = impl.layout.adapters
        names = _publish(adapters, range(1, 6))
        stale, fresh = adapters / ".tmp-crashed", adapters / ".tmp-in-progress"
        for tmp in (stale, fresh):
            tmp.mkdir()
            (tmp / "adapter_model.safetensors").write_bytes(b"x")
        old = time.time() - 7200
        os.utime(stale, (old, old))
        await impl.activate(names[1])  # v2 active
        request = asyncio.ensure_future(impl.chat({"model": "clawray-policy"}))
        await fake.started.wait()  # a request is served by v2
        await impl.activate(names[4])  # v5 active; v2 retiring but still serving
        left = sorted(p.name for p in adapters.iterdir())
        assert left == [".tmp-in-progress", "active.json", names[1], names[4]], left
        assert read_json(adapters / "active.json")["active"] == names[4]
        fake.release.set()
        await request  # v2's last request ends: it is unloaded, then its folder goes
        assert sorted(p.name for p in adapters.iterdir()) == [".tmp-in-progress", "active.json", names[4]]

    asyncio.run(scenario())


@pytest.mark.parametrize(("active", "recent", "loaded", "want_removed"), [
    ("policy-v0005", [], [], ["policy-v0001", "policy-v0002", "policy-v0003"]),
    ("policy-v0002", ["policy-v0003"], ["policy-v0001"], []),  # a rollback: the newer ones stay
    (None, [], [], ["policy-v0001", "policy-v0002", "policy-v0003"]),  # base active: the newest stay
])
def test_retention_rule_keeps_active_recent_loaded_and_newest(active, recent, loaded, want_removed):
    versions = [adapter_name(v) for v in range(1, 6)]
    keep = {n for n in [active, *recent, *loaded] if n}
    assert adapters_to_remove([*versions, ".tmp-x", "active.json", "notes"], keep, keep_newest=2) == want_removed


@pytest.mark.parametrize("count", [1, 5, 8, 9, 10])
def test_fewer_versions_than_the_disk_retention_are_all_kept(count):
    """With `keep_newest` 10 and 8 versions on disk, a slice from index 8 - 10 = -2 kept only the newest 2:
    versions published but not yet activated vanished (the hot-swap test's 404, seen in `make test`)."""
    versions = [adapter_name(v) for v in range(1, count + 1)]
    assert adapters_to_remove(versions, set(), keep_newest=10) == []
    assert adapters_to_remove(versions, set(), keep_newest=count) == []


class _FakePeft:
    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text("{}")


def test_publish_removes_temp_folders_left_by_a_crashed_publish(tmp_path: Path):
    adapters = tmp_path / "adapters"
    crashed, running = adapters / ".tmp-crashed", adapters / ".tmp-other-writer"
    for tmp in (crashed, running):
        tmp.mkdir(parents=True)
    old = time.time() - 7200
    os.utime(crashed, (old, old))
    name, _ = publish_adapter(_FakePeft(), adapters, base_model="tiny", lora=LoRAConfig(), step=1,
                              skill_generation=0, metrics={})
    assert sorted(p.name for p in adapters.iterdir()) == [".tmp-other-writer", name]


def test_disk_retention_below_the_loaded_retention_is_refused():
    from core.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="adapter_disk_retention must be >= engine.adapter_retention"):
        config_from_dict({"engine": {"adapter_retention": 3, "adapter_disk_retention": 2}})
