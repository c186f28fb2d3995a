"""A training run's own records (step log, discard log, newest persisted checkpoint) where every node sees
them (issue 13): with an object-storage root, rank 0 may run on any node, so its local scratch is no
other host's. Simulated hosts: each has its own scratch folder and all share one bucket on a real S3 HTTP
server (moto_server).

The real worker loop (`train.grpo.train_loop_per_worker`) and the driver's `train.job._train` run here
without a cluster: Ray's pieces are replaced by fakes (actors answer in-process, `ray.train.report`
persists the checkpoint where Ray Train would, into the bucket's `checkpoints/<run>/<dir>/`, and
registers only the steps the test says, which is how a run killed between persist and register looks).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import train.job as job  # first: it turns Ray Train V2 on before `ray.train` is imported
from core.config import TrainConfig
from core.contracts import Sample
from core.storage import StorageLayout

RUN = "grpo-hosts"
BATCH = 4
BUILD_TRAINER = job.build_trainer  # the real one: `drive` replaces it in `job`


@pytest.fixture
def blob_root(s3_root: str) -> str:
    """These tests are about a bucket shared by hosts: S3 only."""
    return s3_root


class _Handle:
    """`handle.method.remote(...)` calls the object's method at once (with `ray.get` = identity)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=getattr(self._obj, name))


class FakeReplay:
    """Leases `BATCH` fresh samples per call; the seal of the leases in `refuse` is refused."""

    def __init__(self, refuse: tuple[int, ...] = ()) -> None:
        self.leased, self.refuse, self.commits = 0, refuse, []

    def lease(self, batch, lease_s, owner, min_size):
        self.leased += 1
        samples = [Sample(session_id=f"s{self.leased}-{i}", turn_index=0, prompt_ids=[1, 2],
                          response_ids=[3, 4], response_logprobs=[-1.0, -1.0], reward=float(i % 2),
                          loss_mask=[1, 1], skill_generation=0) for i in range(batch)]
        return f"{uuid.uuid4().hex}-{self.leased}", samples

    def seal(self, lease_id, ids):
        refused = int(lease_id.rsplit("-", 1)[1]) in self.refuse
        return (False, "an evolution claimed support") if refused else (True, "")

    def commit(self, lease_id):
        self.commits.append(lease_id)
        return BATCH

    def release(self, lease_id):
        return BATCH

    def release_owner(self, owner):
        return 0

    def dead_letter(self, ids, why):
        raise AssertionError(f"no sample here is poison: {ids} {why}")


class FakeControl:
    def should_stop(self):
        return False

    def record_step(self, record):
        pass

    def set_state(self, state):
        pass


class FakeBackend:
    """Saves a weights file; `load` records the checkpoint state it was given."""

    def __init__(self) -> None:
        self.peft_model = SimpleNamespace(config=SimpleNamespace(vocab_size=1000))
        self.loaded: list[dict] = []

    def save(self, d: Path, rank: int) -> bool:
        (d / "weights.bin").write_bytes(b"w")
        return True

    def load(self, d: Path) -> None:
        assert (d / "weights.bin").is_file()
        self.loaded.append(json.loads((d / "state.json").read_text()))


class FakeRay:
    """What the loop needs of Ray and Ray Train, for one run at a time.

    `report` persists a checkpoint where Ray Train puts it (`<storage_path>/<run>/<dir>/`, on the bucket
    through the same filesystem `train/job.py` gives Ray) and registers it only if its step is in
    `register`: a checkpoint persisted but never registered is a run that died in between."""

    def __init__(self, monkeypatch, layout: StorageLayout, replay: FakeReplay, register: set[int]) -> None:
        import ray
        import ray.train
        import ray.train.torch
        import torch

        import core.names as names
        import train.grpo as grpo
        from core.blobs import checkpoint_storage

        self.storage_path, self.fs = checkpoint_storage(layout)
        self.register, self.registered = register, []
        self.backend = FakeBackend()
        actors = {"Replay": _Handle(replay), f"TrainControl-{RUN}": _Handle(FakeControl())}
        monkeypatch.setattr(ray, "get", lambda x: x)
        # A handle cached by an earlier test of this process (a real `Replay` of a live local Ray) would
        # be served instead of these fakes: the lookup's cache starts empty here and is dropped after.
        monkeypatch.setattr(names, "_CACHE", {})
        monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: actors[name])
        monkeypatch.setattr(ray.train, "get_context", lambda: SimpleNamespace(
            get_world_rank=lambda: 0, get_world_size=lambda: 1))
        monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
        monkeypatch.setattr(ray.train, "get_checkpoint",
                            lambda: self.registered[-1] if self.registered else None)
        monkeypatch.setattr(ray.train, "report", self.report)
        monkeypatch.setattr(grpo, "build_peft_model", lambda *a, **k: None)
        monkeypatch.setattr(grpo, "make_backend", lambda *a, **k: self.backend)
        monkeypatch.setattr(grpo, "train_step", self.train_step)
        monkeypatch.setattr(grpo, "publish_adapter", self.publish)
        self.published = 0

    @staticmethod
    def train_step(backend, samples, cfg, *, rank, world, device, before_update):
        return {"discarded": not before_update(), "loss": 0.5, "step_s": 0.01}

    def publish(self, peft_model, adapters, **kw) -> tuple[str, str]:
        self.published += 1
        return f"policy-v{self.published:04d}", "uri"

    def report(self, metrics, checkpoint=None, checkpoint_dir_name=None) -> None:
        import pyarrow.fs
        import ray.train

        if checkpoint is None:
            return
        dest = f"{self.storage_path}/{RUN}/{checkpoint_dir_name}"
        fs = self.fs or pyarrow.fs.LocalFileSystem()
        fs.create_dir(dest)
        pyarrow.fs.copy_files(checkpoint.path, dest, destination_filesystem=fs)  # as Ray Train does
        if metrics["step"] in self.register:
            self.registered.append(ray.train.Checkpoint(dest, filesystem=self.fs))


def loop_config(layout: StorageLayout, scratch: Path, max_steps: int) -> dict[str, Any]:
    """The loop config the driver builds, as a worker on the host with local scratch `scratch` gets it."""
    trainer = BUILD_TRAINER(TrainConfig(batch_size=BATCH, min_fresh_samples=BATCH), model_path="m",
                            storage=layout, max_steps=max_steps, run_name=RUN, notify_serving=False)
    return {**trainer.train_loop_config, "storage_root": str(scratch)}


def run_on(host: Path, layout: StorageLayout, max_steps: int) -> None:
    """One run of the worker loop on `host` (rank 0 of a one-worker run)."""
    from train.grpo import train_loop_per_worker

    StorageLayout(host).ensure()  # the host's own scratch folders
    train_loop_per_worker(loop_config(layout, host, max_steps))


def drive(monkeypatch, driver: StorageLayout, worker_host: Path, fake: FakeRay, max_steps: int):
    """`job._train` on the driver's host while its trainer's rank 0 runs on `worker_host`."""
    class Trainer:
        def __init__(self, cfg, *, storage, max_steps, **kw) -> None:
            self.storage, self.max_steps = storage, max_steps

        def fit(self):
            run_on(worker_host, self.storage, self.max_steps)
            return SimpleNamespace(checkpoint=fake.registered[-1] if fake.registered else None)

    monkeypatch.setattr(job, "build_trainer", Trainer)
    return job._train(TrainConfig(), _Handle(FakeControl()), model_path="m", storage=driver,
                      max_steps=max_steps, run_name=RUN, lease_s=60, notify_serving=False, test_hooks=None)


# ------------------------------------------------------------------------------- several hosts, one bucket
def test_the_driver_sees_the_steps_and_discards_rank0_logged_on_another_host(tmp_path, blob_root,
                                                                             monkeypatch):
    driver = StorageLayout(tmp_path / "driver-host", blob_root=blob_root).ensure()
    replay = FakeReplay(refuse=(1,))  # the first lease's seal is refused: one discarded step
    fake = FakeRay(monkeypatch, driver, replay, register={1, 2})
    result = drive(monkeypatch, driver, tmp_path / "worker-host", fake, max_steps=3)
    assert result.error is None
    assert [s["step"] for s in result.steps] == [1, 2]
    assert result.adapters == ["policy-v0001", "policy-v0002"] and len(result.trained_sample_ids) == 2 * BATCH
    assert result.discarded_steps == 1 and result.stop_reason == "max_steps"

    again = drive(monkeypatch, driver, tmp_path / "third-host", fake, max_steps=1)  # only this run's steps
    assert [s["step"] for s in again.steps] == [3] and again.discarded_steps == 0


def test_a_restart_on_another_host_resumes_from_the_newer_unregistered_checkpoint(tmp_path, blob_root,
                                                                                   monkeypatch):
    """Step 2's checkpoint is in the bucket but Ray never registered it (the run died in between): a
    worker on another host must still resume from it, commit its lease and go on with step 3."""
    layout = StorageLayout(tmp_path / "driver-host", blob_root=blob_root)
    replay = FakeReplay()
    fake = FakeRay(monkeypatch, layout, replay, register={1})
    run_on(tmp_path / "host-b", layout, max_steps=2)
    step2_lease = replay.commits[-1]
    assert len(fake.registered) == 1  # Ray registered step 1 only

    fake.backend = FakeBackend()
    run_on(tmp_path / "host-c", layout, max_steps=1)
    assert [s["step"] for s in fake.backend.loaded] == [2]
    assert replay.commits[-2:] == [step2_lease, replay.commits[-1]] and replay.commits[-1] != step2_lease


# ------------------------------------------------------------------------------------ a local storage root
def test_a_local_root_keeps_the_run_files_under_its_checkpoints_folder(tmp_path, monkeypatch):
    layout = StorageLayout(tmp_path / "root").ensure()
    replay = FakeReplay(refuse=(2,))
    fake = FakeRay(monkeypatch, layout, replay, register={1})
    result = drive(monkeypatch, layout, layout.root, fake, max_steps=3)
    assert result.error is None
    assert [s["step"] for s in result.steps] == [1, 2] and result.discarded_steps == 1
    ckpts = layout.checkpoints
    steps = [json.loads(x) for x in (ckpts / f"{RUN}.steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert len((ckpts / f"{RUN}.discarded.jsonl").read_text().splitlines()) == 1
    latest = json.loads((ckpts / f"{RUN}.latest.json").read_text())
    assert latest["step"] == 2 and (ckpts / RUN / latest["dir"] / "state.json").is_file()

    fake.backend = FakeBackend()
    run_on(layout.root, layout, max_steps=1)  # Ray registered step 1 only: step 2 is newer
    assert [s["step"] for s in fake.backend.loaded] == [2]


# ---------------------------------------------------------------------------------- the logs in the bucket
def test_a_writer_that_loses_its_number_appends_at_the_next_and_no_record_is_replaced(blob_root, tmp_path,
                                                                                     monkeypatch):
    """Two writers list the log at once and pick the same number: one create wins, the other gets 412 and
    takes the next number (driven in order: B appends between A's listing and A's write)."""
    from core.blobs import BlobStore
    from train.run_files import RemoteLog

    a, b = RemoteLog(BlobStore(blob_root), "runs/r/steps"), RemoteLog(BlobStore(blob_root), "runs/r/steps")
    write_new = a.blobs.write_new

    def b_first(key, data):
        if not b.count():
            b.append({"writer": "b"})
        return write_new(key, data)

    monkeypatch.setattr(a.blobs, "write_new", b_first)
    a.append({"writer": "a"})
    assert a.read() == [{"writer": "b"}, {"writer": "a"}] and a.read(1) == [{"writer": "a"}]
    assert a.blobs.list("runs/r/steps") == ["000000000001.json", "000000000002.json"]


def test_latest_is_the_newest_entry_and_only_the_newest_few_are_kept(blob_root, tmp_path):
    from train.run_files import LATEST_KEEP, run_files

    files = run_files(StorageLayout(tmp_path, blob_root=blob_root), RUN)
    assert files.latest() == {}
    for step in range(1, LATEST_KEEP + 3):
        files.set_latest({"step": step, "dir": f"d{step}", "lease_id": "l"})
    assert files.latest()["step"] == LATEST_KEEP + 2
    assert len(files.blobs.list(f"runs/{RUN}/latest")) == LATEST_KEEP
    assert not (tmp_path / "checkpoints").exists()  # nothing of the run in this host's scratch
