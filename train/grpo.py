"""The Ray Train (V2) worker loop of the GRPO job: `train_loop_per_worker(config)`.

Per step, as timed phases:
  lease    rank 0 leases a batch from the `Replay` actor (current generation only, GRPO groups whole),
           moves samples the collate rejects to Replay's dead letters, and broadcasts the rest
  step     every worker trains on its shard (train.step), gradients all-reduced by DDP / DeepSpeed
  seal     THE STEP'S COMMIT POINT, after the gradients exist and before the optimizer applies them:
           rank 0 asks Replay to seal the batch (every sample still leased by this step, of the current
           generation, no evolution in progress; train/replay_store.py) and broadcasts the answer.
           Refused (an evolution claimed support from the batch, or the generation moved on): every
           worker drops its gradients, nothing is checkpointed or published, the lease is released
           (valid samples back to fresh) and the loop goes on; counted as `discarded_steps`.
  ckpt     `ray.train.report(metrics, checkpoint=...)`: adapter + optimizer state + step + lease id
  publish  rank 0 writes `adapters/policy-vNNNN/` atomically (on object storage: uploads it and creates
           its version record, core/adapter_store.py) and asks serving to load + activate it
  commit   rank 0 commits the lease: sealed samples become `trained`
So no support sample, and none served under a generation older than the current one at the seal, ever
contributes a gradient to a published adapter.

Resume: the newest checkpoint restores weights, optimizer and step: Ray Train's registered one
(`ray.train.get_checkpoint()`), or a newer one that was persisted but not registered yet when the run
died ("latest", see `_restore`). The checkpoint names the lease it was trained on; rank 0 commits that
lease (its samples are in the restored weights, so they must not be trained again) and releases every
other lease the run still holds (they were not checkpointed, so they must be trained again). Thus a
crash anywhere neither re-trains committed samples nor skips any.

The run's records (step log, discard log, "latest") are files under a local root's `checkpoints/`, or
objects in the bucket with an object-storage root, where the driver and every node see them whichever
node rank 0 ran on (train/run_files.py).

Tests drive interleavings through `config["test_hooks"]["before_seal"]`: the name of an actor whose
`before_seal(info)` rank 0 awaits right before the seal.

Stop: at each step boundary rank 0 stops when the run's `TrainControl` flag is set, when fewer than
`min(min_fresh_samples, batch_size)` fresh samples remain, or after `max_steps` steps of this run.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from core import names
from core.adapter_store import adapter_store
from core.config import TrainConfig
from core.contracts import Sample
from core.storage import StorageLayout, atomic_write_json, read_json
from train.batch import collate
from train.model import build_peft_model, make_backend
from train.publish import notify_serving, publish_adapter
from train.run_files import LocalRunFiles, RemoteRunFiles, run_files
from train.step import train_step

log = logging.getLogger(__name__)

STATE_FILE = "state.json"


def poison_reason(sample: Sample, vocab_size: int) -> str | None:
    """Why the trainer cannot use `sample` (it goes to the dead letters), or None."""
    if any(not 0 <= t < vocab_size for t in (*sample.prompt_ids, *sample.response_ids)):
        return f"token id outside the model's vocabulary (size {vocab_size})"
    try:
        collate([sample], [0.0])
    except ValueError as e:
        return str(e)
    return None


def split_poison(samples: list[Sample], vocab_size: int) -> tuple[list[Sample], dict[str, str]]:
    """(usable samples, {poison sample id: why}). A GRPO group with a poison member leaves the step
    whole: groups are trained whole or not at all."""
    bad = {s.sample_id: why for s in samples if (why := poison_reason(s, vocab_size)) is not None}
    broken = {s.group_id for s in samples if s.sample_id in bad and s.group_id is not None}
    usable = [s for s in samples if s.sample_id not in bad and (s.group_id is None or s.group_id not in broken)]
    return usable, bad


def _broadcast(obj: Any, world: int) -> Any:
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class _Rank0:
    """What only rank 0 does: lease/commit through the `Replay` actor, poll the stop flag, log steps."""

    def __init__(self, cfg: TrainConfig, config: dict[str, Any]) -> None:
        self.cfg, self.run_name = cfg, config["run_name"]
        self.lease_s = float(config["lease_s"])
        self.namespace = config["namespace"]  # of the actors below (`ray.namespace`)
        # Waited for (core/names.py): a Replay being recreated is back within the lookup's timeout.
        self.replay = names.actor(names.REPLAY, self.namespace)
        self.control = names.actor(names.control_name(self.run_name), self.namespace)
        self.storage = StorageLayout(Path(config["storage_root"]), blob_root=config.get("blob_root"))
        self.files = run_files(self.storage, self.run_name)
        self.hook = (config.get("test_hooks") or {}).get("before_seal")
        self.discarded, self.refused = 0, ""  # discarded steps of this run; why the last seal failed

    def recover(self, state: dict[str, Any]) -> None:
        if state.get("lease_id"):
            n = ray.get(self.replay.commit.remote(state["lease_id"]))
            log.info("resume: committed %d samples of checkpointed lease %s", n, state["lease_id"])
        freed = ray.get(self.replay.release_owner.remote(self.run_name))
        log.info("resume: released %d samples of unfinished leases", freed)

    def next_batch(self, vocab_size: int) -> tuple[str, list[Sample]] | str:
        """(lease_id, samples the trainer can use), or the reason to stop."""
        if ray.get(self.control.should_stop.remote()):
            return "stop_requested"
        min_size = min(self.cfg.min_fresh_samples, self.cfg.batch_size)
        while True:  # each round dead-letters at least one sample, so it ends
            lease_id, samples = ray.get(
                self.replay.lease.remote(self.cfg.batch_size, self.lease_s, self.run_name, min_size)
            )
            if not samples:
                return "no_fresh_samples"
            usable = self._usable(samples, vocab_size)
            if usable:
                return lease_id, usable
            ray.get(self.replay.release.remote(lease_id))

    def _usable(self, samples: list[Sample], vocab_size: int) -> list[Sample]:
        """Dead-letter poison samples (`split_poison`); the siblings of a poison group member stay in
        the lease unsealed, so the commit or release hands them back."""
        usable, bad = split_poison(samples, vocab_size)
        for sid, why in bad.items():
            ray.get(self.replay.dead_letter.remote([sid], why))
            log.warning("sample %s rejected by the trainer (dead letter): %s", sid, why)
        return usable

    def seal(self, lease_id: str, samples: list[Sample]) -> bool:
        """The step's commit point (see the module docstring): True when Replay sealed the batch."""
        ids = [s.sample_id for s in samples]
        if self.hook:
            ray.get(names.actor(self.hook, self.namespace).before_seal.remote(
                {"lease_id": lease_id, "sample_ids": ids}))
        ok, why = ray.get(self.replay.seal.remote(lease_id, ids))
        if not ok:
            log.warning("step discarded: the seal of lease %s was refused: %s", lease_id, why)
            self.refused = why
        return bool(ok)

    def discard(self, lease_id: str, samples: list[Sample], metrics: dict[str, Any]) -> None:
        """A refused step: hand the lease back (valid samples become fresh again) and log it."""
        freed = ray.get(self.replay.release.remote(lease_id))
        self.discarded += 1
        self.files.discards.append({
            "lease_id": lease_id, "sample_ids": [s.sample_id for s in samples], "released": freed,
            "reason": self.refused, "step_s": metrics.get("step_s"), "time": time.time()})

    def finish_step(self, backend, state: dict[str, Any], samples: list[Sample], metrics: dict) -> dict:
        """Publish, hot-swap, commit, log. Runs after the step's checkpoint is persisted."""
        t0 = time.perf_counter()
        generation = max(s.skill_generation for s in samples)
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        name, path = publish_adapter(
            backend.peft_model, adapter_store(self.storage), base_model=state["base_model"],
            lora=self.cfg.lora, step=state["step"], skill_generation=generation, metrics=scalars,
        )
        swapped = notify_serving(name, path) if state["notify_serving"] else False
        committed = ray.get(self.replay.commit.remote(state["lease_id"]))
        record = {
            **metrics, "adapter": name, "hot_swapped": swapped, "committed": committed,
            "generation": generation, "publish_s": time.perf_counter() - t0, "time": time.time(),
            "discarded_steps": self.discarded,
        }
        self.files.steps.append(record)
        self.control.record_step.remote(record)
        return record


def _load(backend, state: dict[str, Any], d: Path) -> None:
    backend.load(d)
    saved = read_json(d / STATE_FILE, {})
    state.update(step=saved.get("step", 0), lease_id=saved.get("lease_id"))
    log.info("resumed from checkpoint %s at step %d", d.name, state["step"])


def _restore(backend, state: dict[str, Any], files: LocalRunFiles | RemoteRunFiles) -> None:
    """Load the newest checkpoint: Ray Train's registered one, or a newer one it had not registered yet
    when the run died. Every worker makes the same choice.

    "latest" ({"step", "dir", "lease_id"}) is written by rank 0 as soon as `ray.train.report` returns
    (before publish and commit). Ray Train registers a checkpoint later, in its own controller. When the
    process driving the run dies in between (the Controller actor is killed mid-window), the newest
    checkpoint is persisted but not registered, and `ray.train.get_checkpoint()` resumes from an older
    one: the newer step's samples are committed but its update is lost, and step numbers repeat."""
    ckpt = ray.train.get_checkpoint()
    newest = files.latest()
    if newest.get("dir"):
        registered = -1
        if ckpt is not None:
            with ckpt.as_directory() as d:
                registered = (read_json(Path(d) / STATE_FILE, {}) or {}).get("step", 0)
        if newest["step"] > registered:
            with files.checkpoint(newest["dir"]) as unregistered:
                if unregistered is not None:
                    _load(backend, state, unregistered)
                    return
    if ckpt is not None:
        with ckpt.as_directory() as d:
            _load(backend, state, Path(d))


def _checkpoint_and_report(backend, state: dict[str, Any], metrics: dict, rank: int,
                           files: LocalRunFiles | RemoteRunFiles) -> None:
    """Every worker calls report (it is a barrier); checkpoint files come from the backend. The folder
    name is the same on every rank (step + lease, both broadcast) and known to us, so rank 0 can record
    it in `latest` once the (synchronous) upload is done."""
    name = f"step_{state['step']:08d}_{state['lease_id'][:8]}"
    with tempfile.TemporaryDirectory(prefix="clawray-ckpt-") as tmp:
        d = Path(tmp)
        wrote = backend.save(d, rank)
        if rank == 0:
            atomic_write_json(d / STATE_FILE, {"step": state["step"], "lease_id": state["lease_id"]})
        ckpt = ray.train.Checkpoint.from_directory(tmp) if wrote else None
        ray.train.report(metrics, checkpoint=ckpt, checkpoint_dir_name=name if wrote else None)
    if rank == 0:
        files.set_latest({"step": state["step"], "dir": name, "lease_id": state["lease_id"]})


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker entry point. `config` keys: train (TrainConfig dump), model_path, storage_root,
    blob_root (None for a local root), run_name, max_steps, lease_s, notify_serving, test_hooks (optional,
    tests only)."""
    logging.basicConfig(level=logging.INFO)
    cfg = TrainConfig.model_validate(config["train"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)
    backend = make_backend(build_peft_model(config["model_path"], cfg, device), cfg, device, world)
    state: dict[str, Any] = {
        "step": 0, "lease_id": None, "base_model": config["model_path"],
        "notify_serving": config.get("notify_serving", True),
    }
    files = run_files(StorageLayout(Path(config["storage_root"]), blob_root=config.get("blob_root")),
                      config["run_name"])
    _restore(backend, state, files)
    rank0 = _Rank0(cfg, config) if rank == 0 else None
    if rank0:
        rank0.recover(state)
    vocab_size = int(backend.peft_model.config.vocab_size)
    for _ in range(int(config["max_steps"])):  # a discarded step counts: evolutions cannot pin the loop
        got = _broadcast(rank0.next_batch(vocab_size) if rank0 else None, world)
        if isinstance(got, str):
            log.info("stopping at step %d: %s", state["step"], got)
            break
        lease_id, samples = got

        def sealed(lease_id: str = lease_id, samples: list[Sample] = samples) -> bool:
            return bool(_broadcast(rank0.seal(lease_id, samples) if rank0 else None, world))

        metrics = train_step(backend, samples, cfg, rank=rank, world=world, device=device, before_update=sealed)
        if metrics["discarded"]:
            if rank0:
                rank0.discard(lease_id, samples, metrics)
            continue
        state.update(step=state["step"] + 1, lease_id=lease_id)
        metrics.update(step=state["step"], lease_id=lease_id, sample_ids=[s.sample_id for s in samples])
        _checkpoint_and_report(backend, state, metrics, rank, files)
        if rank0:
            rank0.finish_step(backend, state, samples, metrics)
