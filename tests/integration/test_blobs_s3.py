"""The GRPO job with its storage root on object storage (issue 13): a real Ray Train run (1 CPU worker)
against a real S3 HTTP server (moto_server). Ray Train writes its checkpoints into the bucket through the
filesystem `train/job.py` builds, rank 0 publishes each adapter version and logs each step into the
bucket (train/run_files.py: the driver reads the steps from there, whichever node rank 0 ran on), and a
second run resumes from the checkpoint it finds there.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from core.config import LoRAConfig, ReplayConfig, TrainConfig
from core.storage import StorageLayout
from tests.integration.test_train_job import build_tiny_model, sample

pytestmark = pytest.mark.slow

RUN = "it-s3"


@pytest.fixture
def env(ray_cluster, s3_endpoint, tmp_path: Path, monkeypatch):
    import boto3

    from train.replay import get_or_create_replay

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)  # the driver's; build_trainer passes it on
    bucket = f"clawray-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    storage = StorageLayout(tmp_path / "scratch", blob_root=f"s3://{bucket}/it").ensure()
    with pytest.raises(ValueError):  # the session's system `Replay` must not exist yet (conftest RUN_FIRST):
        ray_cluster.get_actor("Replay", namespace="clawray")  # attaching to it, then killing it, broke the suite
    replay = get_or_create_replay(ReplayConfig(lease_timeout_s=120), storage)
    cfg = TrainConfig(num_workers=1, cpus_per_worker=1, batch_size=4, min_fresh_samples=4, lr=1e-2,
                      lora=LoRAConfig(rank=4, alpha=8))
    yield {"ray": ray_cluster, "storage": storage, "replay": replay, "cfg": cfg,
           "model": str(build_tiny_model(tmp_path / "model"))}
    ray_cluster.kill(replay)  # the name `Replay` must not leak into other modules' tests
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            ray_cluster.get_actor("Replay", namespace="clawray")
        except ValueError:
            break
        time.sleep(0.2)


def test_checkpoints_and_adapters_go_to_the_bucket_and_a_run_resumes_from_it(env) -> None:
    from core.adapter_store import RemoteAdapters
    from core.blobs import BlobStore
    from train.job import run_training

    ray, storage = env["ray"], env["storage"]
    ray.get(env["replay"].append.remote([sample(0, i) for i in range(8)]))

    def run():
        return run_training(env["cfg"], model_path=env["model"], storage=storage, max_steps=1, run_name=RUN,
                            lease_s=120, notify_serving=False)

    first = run()
    assert first.error is None and [s["step"] for s in first.steps] == [1]
    blobs = BlobStore(storage.blob_root)
    prefix = blobs.path("")  # Ray Train reports the checkpoint as a path on the bucket's filesystem
    assert first.checkpoint and first.checkpoint.startswith(f"{prefix}/checkpoints/{RUN}/")
    state = blobs.read(f"{first.checkpoint[len(prefix) + 1:]}/state.json")
    assert state is not None and json.loads(state)["step"] == 1
    # the run's records are in the bucket, none in the driver's scratch: rank 0 may run on another node
    assert blobs.list(f"runs/{RUN}/steps") == ["000000000001.json"]
    latest = json.loads(blobs.read(f"runs/{RUN}/latest/{blobs.list(f'runs/{RUN}/latest')[-1]}"))
    assert latest["step"] == 1 and first.checkpoint.endswith(f"/{latest['dir']}")
    assert not list(storage.checkpoints.glob(f"{RUN}.*"))

    second = run()  # a new trainer: it finds the run's checkpoint in the bucket
    assert second.error is None and [s["step"] for s in second.steps] == [2]
    assert len(blobs.list(f"runs/{RUN}/steps")) == 2
    adapters = RemoteAdapters(storage.blob_root, env["storage"].root / "reader")
    assert adapters.versions() == ["policy-v0001", "policy-v0002"] == first.adapters + second.adapters
    folder = adapters.folder("policy-v0002", None)
    assert (folder / "adapter_model.safetensors").is_file()
    assert json.loads((folder / "manifest.json").read_text())["step"] == 2
