"""Serving adapters published to object storage (issue 13): the trainer's publish uploads to a real S3
server (moto_server); each engine replica (its own local root, as on its own host) resolves the version by
its record, fills a local cache folder from the bucket and hands vLLM that local path; the active pointer
is followed by every replica; retention removes versions from the bucket and the caches.

`PolicyEngineImpl` runs with a fake vLLM (the `VLLMServing` methods it calls).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from core.adapter_store import RemoteAdapters
from core.config import LoRAConfig
from serve.engine import PolicyEngineImpl
from serve.protocol import EngineRequestError
from train.publish import publish_adapter


class FakeVLLM:
    def __init__(self) -> None:
        self.added: dict[str, str] = {}
        self.removed: list[str] = []

    async def add_lora(self, name: str, path: str) -> None:
        assert Path(path, "adapter_config.json").is_file()  # vLLM reads a local folder
        self.added[name] = path

    async def remove_lora(self, name: str) -> None:
        self.removed.append(name)


class FakePeft:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text(f'{{"tag": "{self.tag}"}}')


@pytest.fixture
def bucket_root(s3_endpoint: str, monkeypatch) -> str:
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    name = f"clawray-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return f"s3://{name}/prod"


def _publish(root: str, scratch: Path, n: int) -> list[tuple[str, str]]:
    store = RemoteAdapters(root, scratch)
    return [publish_adapter(FakePeft(str(i)), store, base_model="tiny", lora=LoRAConfig(), step=i,
                            skill_generation=0, metrics={"loss": 0.5}) for i in range(n)]


def _replica(host: Path, root: str, retention: int = 2) -> tuple[PolicyEngineImpl, FakeVLLM]:
    engine = {"adapter_retention": retention, "adapter_disk_retention": retention}
    impl = PolicyEngineImpl("unused", {}, engine, str(host), root)
    impl.vllm = fake = FakeVLLM()
    return impl, fake


def test_every_replica_serves_a_version_from_its_own_cache_filled_from_the_bucket(bucket_root, tmp_path):
    async def scenario() -> None:
        (v1, uri1), = _publish(bucket_root, tmp_path / "trainer", 1)
        assert v1 == "policy-v0001" and uri1.startswith(f"{bucket_root}/adapters/policy-v0001-")
        one, fake1 = _replica(tmp_path / "host1", bucket_root)
        two, fake2 = _replica(tmp_path / "host2", bucket_root)
        await one.load_adapter(v1, uri1)  # what the trainer's notify_serving sends
        await one.activate(v1)
        assert Path(fake1.added[v1]).parent == tmp_path / "host1" / "adapters"
        await two._reconcile()  # the other host follows the pointer, from its own copy
        assert two.reg.active == v1 and Path(fake2.added[v1]).parent == tmp_path / "host2" / "adapters"
        assert Path(fake2.added[v1], "adapter_config.json").read_text() == '{"tag": "0"}'
        with pytest.raises(EngineRequestError) as wrong:
            await one.load_adapter(v1, str(tmp_path / "elsewhere"))
        assert wrong.value.status == 400
        with pytest.raises(EngineRequestError) as missing:
            await one.load_adapter("policy-v0042")
        assert missing.value.status == 404

    asyncio.run(scenario())


def test_versions_outside_retention_leave_the_bucket_and_the_cache(bucket_root, tmp_path):
    async def scenario() -> None:
        impl, fake = _replica(tmp_path / "host", bucket_root, retention=1)
        names = []
        for _ in range(4):  # as training does: publish a version, then serving activates it
            (name, uri), = _publish(bucket_root, tmp_path / "trainer", 1)
            await impl.load_adapter(name, uri)
            await impl.activate(name)
            names.append(name)
        store = RemoteAdapters(bucket_root, tmp_path / "reader")
        assert store.versions() == [names[-1]] and store.read_active()["active"] == names[-1]
        cached = [p.name.rsplit("-", 1)[0] for p in (tmp_path / "host" / "adapters").iterdir()]
        assert cached == [names[-1]] and fake.removed == names[:-1]

    asyncio.run(scenario())
