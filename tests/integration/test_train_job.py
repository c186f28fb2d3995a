"""The GRPO job on a real local Ray cluster: Replay actor + TorchTrainer (2 CPU workers, gloo DDP).

One module-scoped storage root and `Replay` actor; the tests run in order and build on each other
(first window, stop + resume with a crashed lease, generation bump), because each trainer start costs
tens of seconds on the 2-core machines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from core.config import LoRAConfig, ReplayConfig, TrainConfig
from core.contracts import AdapterManifest, Sample
from core.storage import StorageLayout

pytestmark = pytest.mark.slow

RUN = "it-grpo"


def build_tiny_model(out: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def sample(gen: int, i: int, reward: float | None = None, mask: list[int] | None = None) -> Sample:
    resp = [100 + i % 7, 200 + i % 5, 300]
    return Sample(session_id=f"s{i}", turn_index=0, prompt_ids=[1, 2, 3 + i % 11], response_ids=resp,
                  response_logprobs=[-8.0, -8.1, -8.2], reward=reward if reward is not None else float(i % 2),
                  loss_mask=mask or [1, 1, 1], skill_generation=gen)


@pytest.fixture(scope="module")
def env(ray_cluster, tmp_path_factory):
    from train.replay import get_or_create_replay

    root = tmp_path_factory.mktemp("train-it")
    storage = StorageLayout(root / "state").ensure()
    replay = get_or_create_replay(ReplayConfig(lease_timeout_s=120), storage)
    cfg = TrainConfig(num_workers=2, cpus_per_worker=1, batch_size=4, min_fresh_samples=4, lr=1e-2,
                      lora=LoRAConfig(rank=4, alpha=8), loss="importance_sampling")
    yield {"ray": ray_cluster, "storage": storage, "replay": replay, "cfg": cfg,
           "model": str(build_tiny_model(root / "model"))}
    ray_cluster.kill(replay)  # the name `Replay` must not leak into other modules' tests
    deadline = time.time() + 30
    while time.time() < deadline:  # ray.kill is asynchronous: wait until the name is free again
        try:
            ray_cluster.get_actor("Replay", namespace="clawray")
        except ValueError:
            break
        time.sleep(0.2)


def run(env, **kw):
    from train.job import run_training

    return run_training(env["cfg"], model_path=env["model"], storage=env["storage"], run_name=RUN,
                        lease_s=120, **kw)


def states(env, ids):
    return env["ray"].get(env["replay"].states.remote(list(ids)))


def test_first_window_checkpoints_publishes_and_commits_only_current_generation(env) -> None:
    ray, replay = env["ray"], env["replay"]
    stale = [sample(0, i) for i in range(3)]
    ray.get(replay.append.remote(stale))
    assert ray.get(replay.set_generation.remote(1)) == 3
    fresh = [sample(1, i) for i in range(8)]
    masked, support = sample(1, 50, mask=[0, 0, 0]), sample(1, 51)
    ray.get(replay.append.remote(fresh + [masked, support]))
    ray.get(replay.mark_support.remote([support.sample_id]))

    result = run(env, max_steps=2)

    assert result.error is None and result.stop_reason == "max_steps"
    assert [s["step"] for s in result.steps] == [1, 2]
    trained = result.trained_sample_ids
    assert len(trained) == 8 and set(trained) == {s.sample_id for s in fresh}
    assert set(states(env, trained).values()) == {"trained"}
    assert set(states(env, [s.sample_id for s in stale]).values()) == {"retired"}
    assert states(env, [masked.sample_id, support.sample_id]) == {
        masked.sample_id: "masked", support.sample_id: "support"}
    assert result.checkpoint and Path(result.checkpoint, "state.json").exists()
    assert json.loads(Path(result.checkpoint, "state.json").read_text())["step"] == 2
    for version, step in ((1, 1), (2, 2)):
        folder = env["storage"].adapters / f"policy-v{version:04d}"
        manifest = AdapterManifest.model_validate_json((folder / "manifest.json").read_text())
        assert manifest.step == step and manifest.skill_generation == 1 and manifest.rank == 4
        assert (folder / "adapter_model.safetensors").exists() and (folder / "adapter_config.json").exists()
    assert not [p for p in env["storage"].adapters.iterdir() if p.name.startswith(".tmp")]
    assert result.steps[0]["hot_swapped"] is False  # no Serve app in this test: offline training
    assert result.steps[-1]["committed"] == 4


def test_stop_then_resume_continues_from_checkpoint_and_redelivers_crashed_lease(env) -> None:
    from train.job import TrainJob

    ray, replay = env["ray"], env["replay"]
    before = {sid for line in (env["storage"].checkpoints / f"{RUN}.steps.jsonl").read_text().splitlines()
              for sid in json.loads(line)["sample_ids"]}
    batch = [sample(1, 100 + i) for i in range(24)]
    env["window2"] = batch
    ray.get(replay.append.remote(batch))
    # A step of this run that crashed before its checkpoint: its lease is still open.
    crashed_lease, crashed = ray.get(replay.lease.remote(4, 120.0, RUN))
    assert len(crashed) == 4

    job = TrainJob(env["cfg"], model_path=env["model"], storage=env["storage"], run_name=RUN,
                   max_steps=6, lease_s=120)
    job.start()
    deadline = time.time() + 300
    while job.status()["steps"] < 1 and job.running and time.time() < deadline:
        time.sleep(0.2)
    job.request_stop()
    result = job.wait(timeout=300)

    assert result is not None and result.error is None
    assert result.stop_reason == "stop_requested" and 1 <= len(result.steps) < 6
    assert result.steps[0]["step"] == 3  # resumed from the step-2 checkpoint
    assert job.status()["state"] == "finished"
    trained = result.trained_sample_ids
    assert not before & set(trained)  # committed samples are never trained again
    assert {s.sample_id for s in crashed} <= set(trained)  # released at start, oldest first
    assert ray.get(replay.commit.remote(crashed_lease)) == 0


def test_generation_bump_retires_untrained_samples_and_they_never_train(env) -> None:
    ray, replay = env["ray"], env["replay"]
    left = [sid for sid, st in states(env, [s.sample_id for s in env["window2"]]).items() if st == "fresh"]
    assert left, "the stopped window should have left fresh samples"
    ray.get(replay.set_generation.remote(2))
    new = [sample(2, 500 + i) for i in range(4)]
    ray.get(replay.append.remote(new))

    result = run(env, max_steps=3)

    assert result.error is None and result.stop_reason == "no_fresh_samples"
    assert len(result.steps) == 1 and set(result.trained_sample_ids) == {s.sample_id for s in new}
    assert all(s["generation"] == 2 for s in result.steps)
    assert set(states(env, left).values()) == {"retired"}
    stats = ray.get(replay.stats.remote())
    assert stats["generation"] == 2 and stats["by_state"]["retired"] >= 3 + len(left)


def test_deepspeed_zero2_path_trains_checkpoints_and_resumes(env) -> None:
    """The ZeRO-2 code path (meant for GPU) on DeepSpeed's CPU accelerator with gloo."""
    pytest.importorskip("deepspeed")
    from train.job import run_training

    ray, replay = env["ray"], env["replay"]
    gen = ray.get(replay.stats.remote())["generation"]
    new = [sample(gen, 700 + i) for i in range(12)]
    ray.get(replay.append.remote(new))
    cfg = env["cfg"].model_copy(update={"deepspeed_zero2": True, "grad_accum": 2})
    kw = dict(model_path=env["model"], storage=env["storage"], run_name="it-ds", lease_s=120)

    first = run_training(cfg, max_steps=1, **kw)
    second = run_training(cfg, max_steps=1, **kw)

    assert first.error is None and second.error is None, (first.error, second.error)
    assert [s["step"] for s in first.steps + second.steps] == [1, 2]  # resumed from the ZeRO checkpoint
    assert Path(second.checkpoint, "deepspeed").is_dir() and Path(second.checkpoint, "adapter").is_dir()
    assert not set(first.trained_sample_ids) & set(second.trained_sample_ids)
    assert set(states(env, first.trained_sample_ids + second.trained_sample_ids).values()) == {"trained"}


def test_replay_actor_restarts_without_losing_samples_or_leases(env) -> None:
    ray, replay = env["ray"], env["replay"]
    gen = ray.get(replay.stats.remote())["generation"]
    ray.get(replay.append.remote([sample(gen, 900 + i) for i in range(6)]))
    lease_id, leased = ray.get(replay.lease.remote(4, 120.0, "it-restart"))
    before = ray.get(replay.stats.remote())
    ray.kill(replay, no_restart=False)  # a crash: Ray restarts it (max_restarts=-1)
    deadline = time.time() + 60
    while True:
        try:
            after = ray.get(replay.stats.remote())
            break
        except ray.exceptions.RayActorError:
            assert time.time() < deadline, "Replay did not come back"
            time.sleep(0.5)
    assert after["by_state"] == before["by_state"] and after["generation"] == gen
    assert ray.get(replay.seal.remote(lease_id, [s.sample_id for s in leased]))[0]  # the lease survived
    assert ray.get(replay.commit.remote(lease_id)) == len(leased) == 4
