"""Support/query separation while a REAL training step overlaps an evolution (issue 12 item 1).

The GRPO job (Ray Train, 2 gloo workers) leases a batch from the production-named `Replay` actor;
rank 0 then waits in a test-only barrier actor (`test_hooks["before_seal"]`) between the backward pass
and the seal. While it waits, the real fast loop (`EvolutionLoop` + `RayReplayLink` + `SkillBank`)
evolves from failures that are IN the leased batch and bumps the generation. Released, the step must
be discarded; no support sample and no sample of the old generation may reach a published adapter,
and the samples served under the new generation are trained by the next step.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import pytest

from core.config import EvolverConfig, LoRAConfig, ReplayConfig, SkillsConfig, TrainConfig
from core.contracts import AdapterManifest, Sample, Turn
from core.storage import StorageLayout
from tests.integration.helpers import make_seal_barrier
from tests.integration.test_train_job import build_tiny_model

pytestmark = pytest.mark.slow

RUN = "it-overlap"
FEEDBACK = "[Previous Feedback] You must create config.json.bak before modifying config.json."


def turn_and_sample(gen: int, i: int, reward: float) -> tuple[Turn, Sample]:
    """Failures 1 and 2 of generation 0 are one session (its end triggers the evolution)."""
    session = f"ov-{gen}-fail" if gen == 0 and i in (1, 2) else f"ov-{gen}-{i}"
    turn = Turn(session_id=session, turn_index=i, prompt_ids=[1, 2, 3 + i % 11],
                response_ids=[100 + i % 7, 200 + i % 5, 300], response_logprobs=[-8.0, -8.1, -8.2],
                messages=[{"role": "user", "content": "Please modify config.json to set debug=true"}],
                response_text="Done.", skill_generation=gen, last_in_session=i != 1,
                next_state=[{"role": "user", "content": FEEDBACK}] if reward <= 0 else None)
    return turn, Sample.from_turn(turn, reward=reward, trainable=True)


@pytest.fixture(scope="module")
def env(ray_cluster, tmp_path_factory):
    from train.replay import get_or_create_replay

    root = tmp_path_factory.mktemp("overlap-it")
    storage = StorageLayout(root / "state").ensure()
    replay = get_or_create_replay(ReplayConfig(lease_timeout_s=300), storage)
    cfg = TrainConfig(num_workers=2, cpus_per_worker=1, batch_size=4, min_fresh_samples=4, lr=1e-2,
                      lora=LoRAConfig(rank=4, alpha=8), loss="importance_sampling")
    yield {"ray": ray_cluster, "storage": storage, "replay": replay, "cfg": cfg, "root": root,
           "model": str(build_tiny_model(root / "model"))}
    ray_cluster.kill(replay)  # the name `Replay` must not leak into other modules' tests
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            ray_cluster.get_actor("Replay", namespace="clawray")
        except ValueError:
            break
        time.sleep(0.2)


def test_support_and_stale_samples_never_reach_a_published_adapter_when_evolution_overlaps_a_step(env):
    from evolve.actor import RayReplayLink
    from evolve.bank import SkillBank
    from evolve.evolvers import FeedbackEvolver
    from evolve.loop import EvolutionLoop
    from train.job import run_training

    ray, replay, storage = env["ray"], env["replay"], env["storage"]
    # Generation 0: the oldest four are leased first; two of them are failures that will drive an evolution.
    old = [turn_and_sample(0, i, -1.0 if i in (1, 2) else 1.0) for i in range(6)]
    ray.get(replay.append.remote([s for _, s in old]))
    support_ids = {old[1][1].sample_id, old[2][1].sample_id}
    name = f"TestBarrier-{uuid.uuid4().hex[:6]}"
    barrier = make_seal_barrier(ray, name)
    box: dict = {}
    trainer = threading.Thread(target=lambda: box.update(result=run_training(
        env["cfg"], model_path=env["model"], storage=storage, run_name=RUN, lease_s=300, max_steps=3,
        test_hooks={"before_seal": name})))
    trainer.start()
    leased = ray.get(barrier.held_arrival.remote(), timeout=600)  # the step has its gradients now
    assert support_ids <= set(leased["sample_ids"])

    # The fast loop evolves from failures of the leased batch while the step waits before its seal.
    loop = EvolutionLoop(SkillBank(env["root"] / "skills", SkillsConfig(retrieval="template")),
                         EvolverConfig(kind="feedback", failure_rate_threshold=1.0), FeedbackEvolver(),
                         RayReplayLink())
    async def evolve():
        assert await loop.observe(*old[1]) is None
        return await loop.observe(*old[2])  # the session's end: evolve from both failures

    report = asyncio.run(evolve())
    assert report is not None and report.accepted and report.generation == 1 and report.failures == 2, report
    new = [turn_and_sample(1, 50 + i, 1.0 if i % 2 else -1.0)[1] for i in range(4)]
    ray.get(replay.append.remote(new))
    ray.get(barrier.release.remote())
    trainer.join(timeout=600)
    result = box["result"]

    assert result.error is None, result.error
    log = [json.loads(x) for x in (storage.checkpoints / f"{RUN}.steps.jsonl").read_text().splitlines()]
    published = {sid for rec in log for sid in rec["sample_ids"]}
    stale = {s.sample_id for _, s in old} - support_ids
    assert not published & support_ids, "a support sample reached a published adapter"
    assert not published & stale, "a sample of a retired generation reached a published adapter"
    assert published == {s.sample_id for s in new}  # the valid samples were trained by the next step
    for folder in storage.adapters.iterdir():
        if folder.name.startswith("policy-v"):
            manifest = AdapterManifest.model_validate_json((folder / "manifest.json").read_text())
            assert manifest.skill_generation == 1
    assert result.discarded_steps == 1 and ray.get(barrier.count.remote()) == 2
    states = ray.get(replay.states.remote([s.sample_id for _, s in old] + [s.sample_id for s in new]))
    assert {states[i] for i in support_ids} == {"support"}
    assert {states[i] for i in stale} == {"retired"}
    assert {states[s.sample_id] for s in new} == {"trained"}
    ray.kill(barrier)

