"""Shared fixtures. Integration tests share ONE local Ray cluster per test session (start cost)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray fixes its auth mode when first imported and every process of a cluster must agree: the whole test
# session runs with token auth, as `clawray start` does (cluster/cli.py), whichever module imports Ray first.
os.environ.setdefault("RAY_AUTH_MODE", "token")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster for the whole test session (namespace `clawray`)."""
    import ray

    if not ray.is_initialized():
        from cluster.runtime import local_system_config
        from tests.servers import S3_ENV

        for k, v in S3_ENV.items():  # dummy keys: Ray workers reach the tests' S3 server (moto) with them
            os.environ.setdefault(k, v)
        ray.init(
            address="local",  # our own cluster, never someone else's `ray start` on this machine
            num_cpus=8,  # logical CPUs: actors take fractions; the machine has 2 cores
            namespace="clawray",
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
            _system_config=local_system_config(False),  # as the clusters clawray starts (ray.prestart_workers)
        )
    yield ray
    try:
        from ray import serve

        serve.shutdown()
    except Exception:  # noqa: BLE001 - best effort teardown; Ray may already be down
        pass
    ray.shutdown()

# Admin routes need a key; workers inherit the driver's env, so set it before Ray starts.
os.environ.setdefault("CLAWRAY_ADMIN_KEY", "test-admin-key")
ADMIN_HEADERS = {"X-Admin-Key": os.environ["CLAWRAY_ADMIN_KEY"]}


def run_bench_cli(out: Path, *args: str, timeout: float):
    """`clawray bench ... --out OUT` in a child process with its own Ray cluster, as a user runs it."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TRAIN_V2_ENABLED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "harness.cli", "bench", "--out", str(out), *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory) -> str:
    """A real PostgreSQL server for the whole test session (tests isolate by `unique_namespace`)."""
    from tests.servers import postgres

    with postgres(tmp_path_factory.mktemp("pg")) as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgresql"])
def state_cfg(request, tmp_path):
    """Each backend of the state stores in turn: the same contract tests run against both. Yields a
    `core.config.StateConfig` (PostgreSQL: a fresh namespace in the session's real server)."""
    from core.config import StateConfig
    from tests.servers import unique_namespace

    if request.param == "sqlite":
        yield StateConfig()
    else:
        yield StateConfig(dsn=request.getfixturevalue("pg_dsn"), namespace=unique_namespace())


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """A real S3-compatible HTTP server (moto_server) for the whole test session."""
    from tests.servers import S3_ENV, s3_server

    for k, v in S3_ENV.items():
        os.environ.setdefault(k, v)
    with s3_server() as url:
        yield url


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch) -> str:
    """The standard env var botocore (so s3fs) reads for an S3-compatible endpoint; no config key."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    return s3_endpoint


@pytest.fixture
def s3_root(s3_env: str) -> str:
    """An object-storage root in a fresh bucket of the session's S3 server."""
    from tests.servers import make_bucket

    return f"s3://{make_bucket(s3_env)}/team/prod"


@pytest.fixture(params=["local", "s3"])
def blob_root(request, tmp_path) -> str:
    """Each blob backend in turn: a local folder, then a fresh bucket on the real S3 server."""
    return str(tmp_path / "blobs") if request.param == "local" else request.getfixturevalue("s3_root")


@pytest.fixture(scope="session")
def storage_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("storage")


@pytest.fixture(scope="session")
def test_config(storage_root):
    from core.config import load_config

    env = dict(os.environ)
    env["CLAWRAY__STORAGE_ROOT"] = str(storage_root)
    env["CLAWRAY__PROXY__PORT"] = str(_free_port())
    env["CLAWRAY__PROXY__SESSION_IDLE_TIMEOUT_S"] = "3600"
    # No automatic windows during tests (the clock may be in sleep hours): tests trigger OMLS by hand.
    env["CLAWRAY__SCHEDULER__SLEEP_START"] = ""
    env["CLAWRAY__SCHEDULER__SLEEP_END"] = ""
    env["CLAWRAY__SCHEDULER__IDLE_MINUTES"] = ""
    env["CLAWRAY__SCHEDULER__POLL_S"] = "1"
    # The suite's system runs the two-deployment layout (Proxy -> PolicyEngine, as configs/gpu.yaml): a
    # Proxy replica can be killed without restarting vLLM and more Proxy replicas can front the engine.
    # The embedded default (co-located, one replica) has its own module: test_serve_colocated.py.
    env["CLAWRAY__PROXY__COLOCATE"] = "false"
    return load_config(REPO / "configs" / "local.yaml", env=env)


@pytest.fixture(scope="session")
def serve_app(ray_cluster, test_config):
    """The whole clawray system, once per test session: the Serve app (Proxy -> PolicyEngine with real
    vLLM on CPU) plus the Replay, PRM, Evolver, OMLS and Controller actors, wired as in production."""
    from ray import serve

    from cluster.serve_app import APP_NAME
    from cluster.system import start_system

    system = start_system(test_config)
    yield {"base_url": system.base_url, "config": test_config, "handles": system.handles}
    serve.delete(APP_NAME)


@pytest.fixture(scope="session")
def tok(serve_app):
    """The served model's tokenizer (token-exact checks of captured turns)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(serve_app["config"].model_path())


@pytest.fixture(scope="session")
def no_spaces(tok):
    """logit_bias that forbids whitespace-only tokens: the random tiny model otherwise often answers with
    whitespace that detokenizes to nothing, and tests that parse an answer need text."""
    return {str(i): -100 for i in range(len(tok)) if tok.decode([i]).strip() == ""}


@pytest.fixture(scope="session")
def openai_client(serve_app):
    import openai

    return openai.OpenAI(base_url=serve_app["base_url"] + "/v1", api_key="unused", max_retries=0)


# The demo test runs first: it starts a cluster of its own (a subprocess), best before the suite's exists;
# so do the live agent tests (a clawray with a 32k context) and the autoscaling test (a local multi-node
# cluster with its own vLLM engine).
# Modules that run their own `Replay` actor (the production name, in namespace `clawray`) must run
# before the session's whole-system fixture creates the system's `Replay`, and they free the name after.
# The learning test runs right after: it measures the policy on an empty skill library.
RUN_FIRST = ("tests/integration/test_demo.py", "tests/integration/test_agents_live.py",
             "tests/integration/test_cluster_autoscaling.py",
             "tests/integration/test_train_job.py",
             "tests/integration/test_invariant_support_query_overlap.py", "tests/integration/test_blobs_s3.py",
             "tests/integration/test_train_learning.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        return next((i for i, m in enumerate(RUN_FIRST) if item.nodeid.startswith(m)), len(RUN_FIRST))

    items.sort(key=rank)
