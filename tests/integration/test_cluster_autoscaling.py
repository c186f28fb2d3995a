"""Autoscaling into an idle window, proven on a local multi-node cluster (issue 14 item 4).

The cluster (Ray's fake multi-node provider with cluster/cluster-local.yaml, a real autoscaler) and the
clawray system on it run in a subprocess (tests/integration/autoscaling_driver.py): the suite's own Ray
cluster lives in this process and is not touched. The cluster is stopped by the pids of its own process
group (cluster/local_cluster.py), never `ray stop`; on a free port, so no other cluster is in the way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cluster import local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900  # the scenario takes ~2 min on 2 cores (cluster up, system up, window, scale down)


@pytest.fixture
def cluster_dir():
    # Short, under /tmp: Ray's unix socket paths live below it (pytest's tmp_path can be too long).
    path = Path(tempfile.mkdtemp(prefix="clawray-as-", dir="/tmp"))
    yield path
    local_cluster.down(path)  # the driver stops it; this is for a driver killed by the timeout
    shutil.rmtree(path, ignore_errors=True)


def test_a_window_scales_a_training_node_up_trains_on_it_and_the_node_goes_when_idle(cluster_dir):
    out = cluster_dir / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # never the session's cluster
    proc = subprocess.run([sys.executable, "-m", "tests.integration.autoscaling_driver",
                           "--temp-dir", str(cluster_dir), "--out", str(out)],
                          cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    print(json.dumps({k: v for k, v in r.items() if k != "clawray_start"}, indent=1))
    assert "error" not in r, r["error"] + "\n" + r.get("clawray_start", {}).get("tail", "")
    assert r["clawray_start"]["rc"] == 0
    # At rest: a head, the serving node (min_workers 1) with the engine on it, no training node.
    assert sorted(r["nodes_at_start"]) == [[], ["clawray_serve"]]
    assert r["engine_nodes"] and all(c == ["clawray_serve"] for c in r["engine_nodes"])
    assert r["train_nodes_before"] == 0
    # The window: the autoscaler adds a training node for the Controller's request; the workers run there.
    assert r["train_node_joined_s"] < 120
    assert r["train_worker_nodes"] and all(c == ["clawray_train"] for c in r["train_worker_nodes"])
    run = r["run"]
    assert (run["reason"], run["stop_reason"], run["error"], run["steps"]) == ("window", "max_steps", None, 1)
    # The step's adapter is published, activated by the engine and serves the policy alias.
    (adapter,) = run["adapters"]
    assert r["active_adapter"] == adapter and r["served_by"] == adapter
    # The window closed, the request was cleared: the idle training node goes (idle timeout 12 s).
    assert r["train_node_removed_after_run_s"] < 150
    assert sorted(r["alive_nodes_after"]) == [[], ["clawray_serve"]]
    assert proc.returncode == 0
