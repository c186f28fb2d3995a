"""`serve run configs/serve.yaml` is the whole system (issue 14): run exactly as an operator would, in a
subprocess with its own Ray head (tests/integration/serve_run_driver.py), it brings up scoring, evolution,
the scheduler and the Controller with the endpoint: turns are scored, a skill evolves, a window trains and
its adapter is hot-swapped into serving; a redeploy attaches to the actors instead of duplicating them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_serve_run_of_the_shipped_config_runs_the_whole_loop(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TRAIN_V2_ENABLED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.integration.serve_run_driver", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1150)
    result = json.loads(out.read_text()) if out.is_file() else {"error": proc.stderr[-4000:]}
    print(json.dumps({k: v for k, v in result.items() if not k.endswith(".log")}, indent=1, default=str))
    assert "error" not in result, result["error"] + result.get("serve.log", "")
    assert set(result["actors_started_by_serve_run"]) >= {"Replay", "Evolver", "OMLS", "Controller", "PRM-0"}
    assert result["samples_before_evolution"] > 0, "no turn was scored"
    assert result["generation"][1] > result["generation"][0], "no skill evolved"
    assert result["run"]["steps"] >= 1 and not result["run"]["error"], result["run"]
    assert result["adapter"]["active"] != result["adapter"]["before"], "no adapter was hot-swapped"
    assert result["served_after_swap"] == 200
    assert all(n == 1 for n in result["named_actor_counts"].values()), result["named_actor_counts"]
    assert result["ok_all"] and proc.returncode == 0
