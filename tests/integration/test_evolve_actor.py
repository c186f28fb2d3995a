"""The `Evolver` actor on a real local Ray cluster: failing turns + feedback + session end -> new skill,
generation bump, support set and generation announced to the replay actor."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from core.config import EvolverConfig, SkillsConfig
from core.contracts import Sample, Turn
from evolve.actor import get_or_create_evolver
from evolve.bank import SkillBank
from evolve.retrieval import SkillSearch
from evolve.scopes import request_scopes

FEEDBACK = "[Previous Feedback] You must create config.json.bak before modifying config.json."


def turn_and_sample(sid: str, i: int, reward: float, feedback: str | None = None,
                    last: bool = False) -> tuple[Turn, Sample]:
    turn = Turn(session_id=sid, turn_index=i, prompt_ids=[1, 2, 3], response_ids=[4, 5],
                response_logprobs=[-0.5, -0.7], response_text="I changed config.json.",
                messages=[{"role": "user", "content": "Please modify config.json to set debug=true"}],
                next_state=[{"role": "user", "content": feedback}] if feedback else None,
                last_in_session=last)
    return turn, Sample.from_turn(turn, reward=reward, trainable=True)


@pytest.fixture
def recording_replay(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class RecordingReplay:
        def __init__(self):
            self.support, self.generations, self.claims = [], [], {}

        def begin_evolution(self, ids, ttl_s):
            token = str(len(self.claims))
            self.claims[token] = list(ids)
            return token, list(ids)

        def end_evolution(self, token, generation, release_ids):
            if generation is not None:  # S changed: the claims stay support
                self.support.append(self.claims[token])
                self.generations.append(generation)
            return {}

        def stats(self):
            return {"generation": 0}

        def seen(self):
            return self.support, self.generations

    name = f"Replay-test-{uuid.uuid4().hex[:6]}"
    handle = RecordingReplay.options(name=name, namespace="clawray").remote()
    yield name, handle
    ray.kill(handle)


def test_failing_session_evolves_a_skill_and_bumps_the_generation(ray_cluster, recording_replay,
                                                                  tmp_path: Path):
    ray = ray_cluster
    replay_name, replay = recording_replay
    skills_cfg = SkillsConfig(retrieval="template")
    evolver_cfg = EvolverConfig(kind="feedback", failure_rate_threshold=1.0)  # only session end fires
    name = f"Evolver-test-{uuid.uuid4().hex[:6]}"
    actor = get_or_create_evolver(tmp_path / "skills", skills_cfg, evolver_cfg, name=name,
                                  replay_name=replay_name)
    try:
        t0, s0 = turn_and_sample("sess-1", 0, -1.0, FEEDBACK)
        assert ray.get(actor.observe.remote(t0, s0), timeout=120) is None
        t1, s1 = turn_and_sample("sess-1", 1, 1.0, last=True)
        report = ray.get(actor.observe.remote(t1, s1), timeout=60)
        assert report["trigger"] == "session_end" and report["generation"] == 1
        assert report["accepted"] == ["create-config-json-bak-before-modifying"]

        stats = ray.get(actor.stats.remote())
        assert stats["evolutions_triggered"] == 1 and stats["evolutions_accepted"] == 1
        assert stats["skills"] == 1 and stats["generation"] == 1 and stats["replay_errors"] == 0
        support, generations = ray.get(replay.seen.remote())
        assert support == [[s0.sample_id]] and generations == [1]

        # The read side (what the Proxy uses) sees the new skill for the next request.
        search = SkillSearch(SkillBank(tmp_path / "skills", skills_cfg), skills_cfg)
        assert search.generation == 1
        names = [s.name for s in search.retrieve("modify settings.json please", scopes=request_scopes("default/default"))]
        assert "create-config-json-bak-before-modifying" in names
        assert (tmp_path / "skills" / "create-config-json-bak-before-modifying" / "SKILL.md").is_file()
    finally:
        ray.kill(actor)


def test_evolver_without_a_replay_actor_does_not_crash(ray_cluster, tmp_path: Path):
    ray = ray_cluster
    name = f"Evolver-test-{uuid.uuid4().hex[:6]}"
    actor = get_or_create_evolver(tmp_path / "skills", SkillsConfig(), EvolverConfig(), name=name,
                                  replay_name="NoSuchReplay")
    try:
        report = ray.get(actor.observe.remote(*turn_and_sample("s", 0, -1.0, FEEDBACK)), timeout=120)
        assert report["generation"] == 1 and report["trigger"] == "failure_rate"
        report = ray.get(actor.evolve_now.remote(), timeout=60)
        assert report is None
        assert ray.get(actor.generation.remote()) == 1
    finally:
        ray.kill(actor)
