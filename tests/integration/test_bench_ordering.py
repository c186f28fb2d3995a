"""Does the loop help, on a smaller version of benchmarks/efficacy.py's run (issue 18): `clawray bench` with
the instruction-following model, seeds 0-2 of baseline, skills and full, every run on a fresh system in a
child process, as a user runs it (~16 minutes on 2 cores of an AVX2-only CPU; `make test-efficacy`, not in CI).

Asserted: the mean accuracies are ordered baseline < skills < full, and no seed scores lower with skills
than without. Not asserted: that each gap exceeds its 95% interval. Three seeds cannot show that here;
ten do, narrowly, on the AVX2 fp32 build (benchmarks/RESULTS.md, docs/bench.md "Measured over 10 seeds").
Which model `make instruct-model` builds depends on the CPU: this passes on that build and fails on the
Xeon's bf16 build, where full is below skills on these seeds (docs/bench.md).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_bench_cli

pytestmark = [pytest.mark.slow, pytest.mark.efficacy]


def test_skills_beat_the_bare_model_and_windows_beat_skills(tmp_path):
    out = tmp_path / "bench"
    proc = run_bench_cli(out, "--seeds", "3", "--conditions", "baseline,skills,full", "--model", "tiny-instruct",
                         timeout=2400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert result["model"] == "tiny-instruct" and result["seeds"] == [0, 1, 2]
    mean = {c: s["overall"]["accuracy"] for c, s in result["summary"].items()}
    assert mean["baseline"] < mean["skills"] < mean["full"], mean
    per_seed = {(r["condition"], r["seed"]): sum(d["accuracy"] for d in r["days"]) for r in result["runs"]}
    for seed in result["seeds"]:
        assert per_seed["skills", seed] >= per_seed["baseline", seed], (seed, per_seed)
    assert all(r["days"][-1]["adapters"] >= 2 for r in result["runs"] if r["condition"] == "full")
