"""The dashboard shows the system (issue 14): on a Ray cluster of its own with the dashboard and a metrics
export port (tests/integration/dashboard_driver.py, in a subprocess: the suite's cluster has no
dashboard), after a short workload and one training window, the dashboard's HTTP API lists every named
actor and every deployment under its name, and the head's Prometheus endpoint carries every metric of
docs/metrics.md with a sane value, still there after a quiet spell longer than Ray keeps a gauge that is
not set again. The Grafana dashboard's queries are checked against the same
catalogue in tests/unit/test_metrics_catalogue.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_dashboard_lists_every_actor_and_deployment_and_prometheus_every_documented_metric(tmp_path):
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO), "RAY_TRAIN_V2_ENABLED": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tests.integration.dashboard_driver", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1100)
    result = json.loads(out.read_text()) if out.is_file() else {"error": proc.stderr[-4000:]}
    print(json.dumps({k: v for k, v in result.items() if k != "scraped"}, indent=1, default=str))
    print(f"driver wall time {time.monotonic() - t0:.0f} s")
    assert "error" not in result, result["error"]
    assert result["metrics_port"] in result["node_metrics_ports"], "scraped a port that is not the node's"
    assert result["training"]["error"] is None and result["training"]["steps"] >= 1, result["training"]
    assert result["dashboard_problems"] == {}, result["dashboard"]
    assert result["metric_problems"] == {}
    assert result["metric_problems_after_quiet"] == {}, "metrics vanished while nothing happened"
    assert result["unauthenticated_dashboard_status"] == 401, "the dashboard API answered without the token"
    assert "clawray.json" in result["grafana"]["files"] and "default_grafana_dashboard.json" in result["grafana"]["files"]
    assert result["ok"] and proc.returncode == 0
