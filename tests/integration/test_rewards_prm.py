"""The PRM actor pool on a real local Ray cluster with a scripted OpenAI-compatible judge.

Turn in -> sample with reward and votes durably stored; a failing or killed judge -> a typed,
retryable error and nothing stored; the judge back -> the same turn is scored (once).
"""

from __future__ import annotations

import functools
import time
import uuid

import pytest

from core.config import LLMEndpoint, RewardsConfig
from core.contracts import Turn, TurnType
from rewards.errors import JudgeUnavailable, SinkUnavailable
from rewards.pool import PRMPool, start_prm_pool
from rewards.sinks import LocalSampleSink, ReplayActorSink
from tests.fake_actors import MemoryReplay, RecordingEvolver
from tests.fake_judge import FakeJudge, Script


def make_turn(i: int = 0, sid: str = "sess-1", **kw) -> Turn:
    base = dict(session_id=sid, turn_index=i, prompt_ids=[1, 2, 3], response_ids=[4, 5, 6],
                response_logprobs=[-0.1, -0.2, -0.3], response_text=f"answer {i}",
                messages=[{"role": "user", "content": f"question {i}"}],
                next_state=[{"role": "user", "content": "great, thanks"}])
    return Turn(**{**base, **kw})


def cfg_for(judge: FakeJudge, **kw) -> RewardsConfig:
    ep = LLMEndpoint(base_url=judge.base_url, model="judge", timeout_s=5, max_retries=1, backoff_s=0.05)
    return RewardsConfig(judge=ep, **{"votes": 3, "max_concurrency": 4, **kw})


@pytest.fixture
def namespace(ray_cluster):
    """A namespace of our own, so test actors never meet other tests' `PRM-0`; killed afterwards."""
    ns = f"rewards-test-{uuid.uuid4().hex[:8]}"
    yield ns
    for actor in ray_cluster.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == ns:
            try:
                ray_cluster.kill(ray_cluster.get_actor(actor["name"], namespace=ns))
            except ValueError:  # already gone: its last handle went out of scope with the test
                pass


def test_turn_becomes_a_scored_durable_sample(ray_cluster, namespace, tmp_path):
    ray = ray_cluster
    db = tmp_path / "samples.sqlite"
    with FakeJudge(Script(replies=["ok. Score: 1", "fine\nScore: 1", "hmm \\boxed{-1}"])) as judge:
        handles = start_prm_pool(cfg_for(judge), functools.partial(LocalSampleSink, db), 2, namespace=namespace)
        assert [h for h in handles] and len(handles) == 2
        pool = PRMPool(handles)
        sample = ray.get(pool.score(make_turn()), timeout=60)  # no Evolver running: still scored
        assert sample.reward == 1 and sample.trainable and sample.reward_source == "judge"
        assert sorted(v.score for v in sample.votes) == [-1, 1, 1]
        stored = LocalSampleSink(db).samples("sess-1")
        assert [s.sample_id for s in stored] == [sample.sample_id]
        assert stored[0].votes == sample.votes and stored[0].loss_mask == [1, 1, 1]
        assert ray.get(pool.score(make_turn(1, turn_type=TurnType.side)), timeout=60) is None
        status = ray.get(pool.pick("sess-1").status.remote())
        assert status["counts"]["scored"] == 1 and status["usage"]["judge"]["calls"] == 3


def test_dead_judge_loses_nothing_and_scores_when_back(ray_cluster, namespace, tmp_path):
    ray = ray_cluster
    db = tmp_path / "samples.sqlite"
    judge = FakeJudge(Script(replies=["Score: -1"])).start()
    port = judge.port
    try:
        (prm,) = start_prm_pool(cfg_for(judge), functools.partial(LocalSampleSink, db), 1, namespace=namespace)
        first = make_turn(0)
        assert ray.get(prm.score.remote(first), timeout=60).reward == -1

        judge.script.fail_status = 500  # judge returning 500s
        with pytest.raises(JudgeUnavailable) as e:
            ray.get(prm.score.remote(make_turn(1)), timeout=60)
        assert e.value.retryable and "500" in str(e.value)
        assert LocalSampleSink(db).count() == 1

        judge.script.fail_status, judge.script.delay_s = None, 3.0
        pending = make_turn(2)
        ref = prm.score.remote(pending)
        time.sleep(1.0)  # the votes are in flight now
        judge.stop()  # judge killed mid-flight
        with pytest.raises(JudgeUnavailable):
            ray.get(ref, timeout=60)
        assert LocalSampleSink(db).count() == 1  # nothing half-written

        judge = FakeJudge(Script(replies=["Score: 1"]), port=port).start()  # judge back, same address
        again = ray.get(prm.score.remote(pending), timeout=60)  # the outbox re-sends the turn
        assert again.reward == 1 and again.sample_id == pending.turn_id
        ray.get(prm.score.remote(pending), timeout=60)  # re-delivered once more: stored once
        assert [s.turn_index for s in LocalSampleSink(db).samples()] == [0, 2]
    finally:
        judge.stop()


def test_evolver_is_notified_and_replay_actor_sink(ray_cluster, namespace):
    ray = ray_cluster
    with FakeJudge(Script(replies=["Score: 1"])) as judge:
        evolver = ray.remote(RecordingEvolver).options(name="Evolver", namespace=namespace).remote()
        sink = functools.partial(ReplayActorSink, "Replay", namespace)
        (prm,) = start_prm_pool(cfg_for(judge), sink, 1, namespace=namespace)
        turn = make_turn()
        with pytest.raises(SinkUnavailable) as e:  # no Replay actor yet: retryable, nothing lost
            ray.get(prm.score.remote(turn), timeout=60)
        assert e.value.retryable
        replay = ray.remote(MemoryReplay).options(name="Replay", namespace=namespace).remote()
        sample = ray.get(prm.score.remote(turn), timeout=60)
        assert ray.get(replay.ids.remote()) == [sample.sample_id]
        deadline = time.monotonic() + 10
        while not ray.get(evolver.observed.remote()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ray.get(evolver.observed.remote()) == [(turn.turn_id, 1.0)]


def test_prm_actor_restarts_after_a_crash(ray_cluster, namespace, tmp_path):
    ray = ray_cluster
    db = tmp_path / "samples.sqlite"
    with FakeJudge(Script(replies=["Score: 1"])) as judge:
        (prm,) = start_prm_pool(cfg_for(judge), functools.partial(LocalSampleSink, db), 1, namespace=namespace)
        ray.kill(prm, no_restart=False)
        deadline = time.monotonic() + 60
        while True:
            try:
                sample = ray.get(prm.score.remote(make_turn()), timeout=30)
                break
            except ray.exceptions.RayActorError:  # restarting: the outbox would retry the same way
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert sample.reward == 1 and LocalSampleSink(db).count() == 1
