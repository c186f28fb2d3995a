"""The `Evolver` actor with the skill library in a bucket (issue 13, evolve/mirror.py) on a real local Ray
cluster and a real S3 server: every committed change is published, a Proxy-side reader on "another host"
sees it, and an Evolver restarted on an empty folder (another host) continues the library with the same
generation instead of skipping one."""

from __future__ import annotations

import uuid
from pathlib import Path

from core.config import REPO_ROOT, EvolverConfig, SkillsConfig
from core.names import DEFAULT_NAMESPACE as NAMESPACE
from evolve.actor import Evolver
from evolve.mirror import SkillMirror
from evolve.scopes import request_scopes
from evolve.snapshot_reader import SnapshotReader
from tests.integration.test_evolve_actor import FEEDBACK, turn_and_sample
from tests.servers import S3_ENV
from tests.unit.test_evolve_mirror import make_bucket

CFG = SkillsConfig(retrieval="template")


def test_an_evolver_on_another_host_continues_the_library_in_the_bucket(ray_cluster, s3_endpoint, monkeypatch,
                                                                        tmp_path: Path):
    ray = ray_cluster
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    replay_name = "NoSuchReplay"  # skills only: generations are the bank's and the bucket's
    root = f"s3://{make_bucket(s3_endpoint)}/prod"
    env = {"env_vars": {**S3_ENV, "AWS_ENDPOINT_URL_S3": s3_endpoint, "PYTHONPATH": str(REPO_ROOT)}}
    evolver_cfg = EvolverConfig(kind="feedback", failure_rate_threshold=1.0)  # only session end fires

    def start(host: str):
        # As `get_or_create_evolver(..., blob_root=...)` creates it, plus the test S3 server's endpoint (on a
        # cluster every node's env has it).
        name = f"Evolver-test-{uuid.uuid4().hex[:6]}"
        return Evolver.options(name=name, namespace=NAMESPACE, runtime_env=env).remote(
            str(tmp_path / host / "skills"), CFG, evolver_cfg, None, replay_name, root)

    def evolve(actor, sid: str) -> dict:
        ray.get(actor.observe.remote(*turn_and_sample(sid, 0, -1.0, FEEDBACK)), timeout=120)
        return ray.get(actor.observe.remote(*turn_and_sample(sid, 1, 1.0, last=True)), timeout=60)

    first = start("host-a")
    try:
        assert evolve(first, "sess-1")["generation"] == 1
        stats = ray.get(first.stats.remote())
        assert stats["skills_version"] == 1 and stats["publish_errors"] == 0
    finally:
        ray.kill(first, no_restart=True)
    reader = SnapshotReader(root, tmp_path / "proxy-host" / "skills-snapshots", CFG)
    assert (reader.version, reader.generation) == (1, 1)
    assert "create-config-json-bak-before-modifying" in [s.name for s in reader.search.retrieve("config.json", scopes=request_scopes("default/default"))]

    second = start("host-b")  # an empty skills folder
    try:
        assert ray.get(second.generation.remote()) == 1
        assert ray.get(second.reconcile_generation.remote(1)) == 1  # Replay's floor: nothing to skip
        assert SkillMirror(root, tmp_path / "probe").versions() == [1]  # nothing re-published
        assert ray.get(second.stats.remote())["skills"] == 1
    finally:
        ray.kill(second, no_restart=True)
