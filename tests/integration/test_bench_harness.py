"""`clawray bench` end to end (issue 18 items 2-3): the project's workload in four conditions, one seed,
each run on a fresh system of its own (Ray, actors, vLLM on CPU) in a child process, as a user runs it.

What each condition must do is checked on what the runs report: nothing learns in `baseline`, `skills`
grows skills but publishes no adapter, `full` trains an adapter every evening (but the last), `groups`
re-samples GRPO groups through the engine before its evening trains them, and the results folder holds bench.json (per day and overall, the ordering check) and bench.png. Whether the
ordering baseline < skills < full holds is a measurement (docs/bench.md), not asserted here: the tiny
CPU model has random weights and cannot read the skills it is given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_bench_runs_every_condition_on_a_fresh_system(tmp_path):
    out = tmp_path / "bench"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_TRAIN_V2_ENABLED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bench", "--seeds", "1", "--out", str(out),
                           "--conditions", "baseline,skills,full,groups"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    runs = {r["condition"]: r for r in result["runs"]}
    assert set(runs) == {"baseline", "skills", "full", "groups"} and result["seeds"] == [0]
    for r in runs.values():
        assert [d["day"] for d in r["days"]] == ["day01", "day02"]
        assert all(d["rounds"] == 7 and d["errors"] == 0 and 0 <= d["accuracy"] <= 1 for d in r["days"])
        assert r["days"][-1]["samples"] >= 14  # every round's reply was scored and stored
    assert all(d["skills"] == 0 and d["adapters"] == 0 for d in runs["baseline"]["days"])
    assert all(d["adapters"] == 0 and d["window"] is None for d in runs["skills"]["days"])
    evening = runs["full"]["days"][0]["window"]
    assert evening["steps"] >= 1 and not evening["error"] and runs["full"]["days"][1]["adapters"] >= 1
    assert runs["full"]["days"][1]["window"] is None  # no window after the last day
    assert evening["rollouts"] is None  # `full` trains the turns as served
    # `groups`: the evening re-sampled the afternoon's gradable prompts (multiple choice, status; the file
    # rounds' checks read files: ungradable) and stored the groups whose rewards differ, trained whole.
    groups = runs["groups"]["days"][0]["window"]["rollouts"]
    assert groups["prompts"] >= 2 and groups["failed"] == 0 and groups["ungradable"] >= 1
    assert groups["samples"] == 8 * groups["groups"] and groups["groups"] + groups["uniform"] + groups["ungradable"] \
        == groups["prompts"]
    assert runs["groups"]["days"][0]["window"]["trained"] >= groups["samples"] or groups["groups"] == 0
    assert [(o["lower"], o["higher"], o["holds"]) for o in result["ordering"]] == [
        ("baseline", "skills", None), ("skills", "full", None), ("full", "groups", None)]  # one seed: no verdict
    assert "baseline < skills: gap" in proc.stdout and result["model"] == "tiny"
