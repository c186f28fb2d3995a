"""Several hosts, one state: a two-node Ray cluster on this machine (tests/integration/multihost_driver.py,
in a subprocess: it needs a Ray cluster of its own), Proxy replicas on different nodes, the session store,
outbox and Replay in a real PostgreSQL server, blobs in a real S3 server (moto_server); kill -9 of a Proxy replica mid-stream and of the Replay
actor under load from the OpenAI SDK; then counts compared: no accepted turn or sample lost or duplicated."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_two_hosts_share_state_in_postgresql_and_lose_nothing_under_kill_9(pg_dsn, s3_endpoint, tmp_path):
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO), "RAY_TRAIN_V2_ENABLED": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    proc = subprocess.run([sys.executable, "-m", "tests.integration.multihost_driver", "--dsn", pg_dsn,
                           "--s3", s3_endpoint, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1100)
    result = json.loads(out.read_text()) if out.is_file() else {"error": proc.stderr[-4000:]}
    print(json.dumps({k: v for k, v in result.items() if k != "error"}, indent=1, default=str))
    assert "error" not in result, result["error"]
    assert result["proxy_nodes"] == 2, "the two Proxy replicas were not on different nodes"
    assert not result["replica_kill"]["stream_ended_cleanly"], "the victim stream was not cut mid-stream"
    assert result["unmatched_ok_replies"] == 0, "replies the client got have no stored turn"
    assert result["turns"] == result["distinct_turn_ids"] == result["samples"], "turns lost or duplicated"
    assert result["samples_in_postgresql"] == result["samples"], "Replay's samples are not in PostgreSQL"
    assert not result["bad_session_indexes"], result["bad_session_indexes"]
    assert not result["failed_outside_outage"], result["failed_outside_outage"]
    assert result["adapter_uri"].startswith("s3://") and result["adapter_served"], "no adapter served from S3"
    assert len(result["replicas_seen"]) >= 2 and result["ok_all"] and proc.returncode == 0
