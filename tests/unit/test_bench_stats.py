"""`clawray bench`'s statistics (harness/bench_stats.py) and its pure helpers (harness/bench.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness import bench_stats as bs
from harness.bench import GROUP_SIZE, WINDOW_BATCH, WINDOW_STEPS, bench_config, halves, parse_conditions


def run(cond: str, seed: int, accs: list[float], rounds: int = 4) -> dict:
    return {"condition": cond, "seed": seed,
            "days": [{"day": f"day{i + 1:02d}", "accuracy": a, "completion": a / 2, "rounds": rounds,
                      "samples": 10 * (i + 1), "skills": i, "adapters": i} for i, a in enumerate(accs)]}


def test_mean_ci_is_the_student_t_interval():
    m, half = bs.mean_ci([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4)
    assert half == pytest.approx(4.302653 * 0.2 / math.sqrt(3), rel=1e-5)  # t(0.975, 2) * sd / sqrt(n)
    assert bs.mean_ci([0.5]) == (0.5, None)
    assert math.isnan(bs.mean_ci([])[0])


def test_overall_weights_days_by_rounds():
    r = {"days": [{"accuracy": 1.0, "completion": 1.0, "rounds": 1},
                  {"accuracy": 0.0, "completion": 0.0, "rounds": 3}]}
    assert bs.overall(r) == {"accuracy": 0.25, "completion": 0.25}


def test_summary_and_ordering_over_seeds():
    runs = [run("baseline", s, [0.10 + 0.01 * s, 0.12]) for s in range(3)]
    runs += [run("skills", s, [0.30 + 0.01 * s, 0.35]) for s in range(3)]
    runs += [run("full", s, [0.31 + 0.2 * s, 0.36]) for s in range(3)]  # noisy: its interval is wide
    summary = bs.summarize(runs)
    assert list(summary) == ["baseline", "skills", "full"]
    day1 = summary["skills"]["days"][0]
    assert day1["accuracy"] == pytest.approx(0.31) and day1["accuracy_ci"] > 0 and day1["skills"] == 0
    assert summary["baseline"]["overall"]["seeds"] == [0, 1, 2]
    (a, b) = bs.ordering(summary)
    assert (a["lower"], a["higher"], a["holds"]) == ("baseline", "skills", True)
    assert a["gap"] == pytest.approx(0.215) and a["ci"] < a["gap"]
    assert (b["lower"], b["higher"], b["holds"]) == ("skills", "full", False)  # gap inside its interval


def test_paired_gaps_judge_a_consistent_improvement_that_the_overlap_rule_misses():
    """Seeds differ a lot (the same sessions are harder in one seed), but full beats skills by 0.05 in every
    seed: the per-seed differences have a tight interval; the two conditions' intervals overlap."""
    runs = [run("skills", s, [0.3 + 0.2 * s]) for s in range(3)]
    runs += [run("full", s, [0.35 + 0.2 * s + 0.01 * s]) for s in range(3)]
    summary = bs.summarize(runs)
    assert bs.paired_gaps(runs, "skills", "full") == pytest.approx([0.05, 0.06, 0.07])
    (o,) = bs.ordering(summary, runs=runs)
    assert o["gap"] == pytest.approx(0.06) and o["ci"] == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-5)
    assert o["holds"] and o["ci_unpaired"] > o["gap"]
    (u,) = bs.ordering(summary)  # without the runs: the overlap rule only
    assert u["ci"] == u["ci_unpaired"] and not u["holds"]


def test_ordering_with_one_seed_has_no_verdict_and_skips_absent_conditions():
    summary = bs.summarize([run("baseline", 0, [0.1]), run("full", 0, [0.5])])
    (o,) = bs.ordering(summary)
    assert (o["lower"], o["higher"], o["ci"], o["holds"]) == ("baseline", "full", None, None)


def test_plot_writes_a_png(tmp_path: Path):
    summary = bs.summarize([run(c, s, [0.1, 0.2]) for c in bs.ORDER for s in range(2)])
    path = bs.plot(summary, tmp_path / "b.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_conditions_are_checked_and_the_day_is_split_at_midday():
    assert parse_conditions("full, baseline,full") == ["full", "baseline"]
    with pytest.raises(ValueError, match="valid: baseline, skills, full"):
        parse_conditions("baseline,rl")
    assert halves([1, 2, 3, 4, 5]) == ([1, 2], [3, 4, 5]) and halves([]) == ([], [])


@pytest.mark.parametrize("condition", ["baseline", "skills", "full", "batchnorm"])
def test_each_condition_is_a_fresh_system_with_what_it_promises(tmp_path: Path, condition: str):
    from core.config import load_config

    cfg = bench_config(load_config(None), condition, 7, tmp_path / "state", None)
    assert cfg.storage_path() == tmp_path / "state" and cfg.train.seed == 7 and cfg.train.min_fresh_samples == 1
    assert cfg.skills.enabled == (condition != "baseline")
    # No window opens by itself (the harness opens `full`'s evenings); memory and the collective job off.
    assert cfg.scheduler.mode == "skills_only" and not cfg.memory.enabled
    assert not cfg.evolver.collective.enabled and cfg.evolver.scope == "user"
    assert not cfg.evolver.on_session_end and cfg.evolver.every_n_turns == 0
    # `full` re-samples GRPO groups in its windows; `batchnorm` trains the turns as served.
    assert cfg.train.rollouts.enabled == (condition == "full")
    assert cfg.train.rollouts.group_size == (GROUP_SIZE if condition == "full" else 0)
    assert (cfg.train.max_steps_per_window, cfg.train.batch_size) == (WINDOW_STEPS, WINDOW_BATCH) == (8, 8)


def test_a_bench_may_run_the_instruction_following_model(tmp_path: Path):
    from core.config import load_config

    cfg = bench_config(load_config(None), "full", 0, tmp_path, None, model="tiny-instruct")
    assert cfg.model_path() == str(cfg.cache_path() / "tiny-instruct")
    assert bench_config(load_config(None), "full", 0, tmp_path, None).model_path().endswith("tiny-chat")


def test_additions_to_full_are_each_compared_with_full():
    summary = bs.summarize([run(c, s, [0.1 * (i + 1)] * 2) for i, c in enumerate(bs.ORDER) for s in range(2)])
    got = [(o["lower"], o["higher"]) for o in bs.ordering(summary)]
    assert got == [("baseline", "skills"), ("skills", "full"), ("batchnorm", "full"), ("full", "opd")]


def test_the_opd_condition_needs_a_teacher_and_sets_the_weight(tmp_path: Path):
    from core.config import load_config
    from harness.bench import OPD_WEIGHT, run_bench

    cfg = bench_config(load_config(None), "opd", 0, tmp_path, None)
    assert cfg.train.opd_weight == OPD_WEIGHT and cfg.train.rollouts.enabled  # `full` plus the teacher
    assert bench_config(load_config(None), "full", 0, tmp_path, None).train.opd_weight == 0.0
    with pytest.raises(ValueError, match="--teacher"):
        run_bench(tmp_path, ["full", "opd"], 1, tmp_path / "out")


def test_a_run_starts_from_an_empty_folder_when_an_earlier_bench_left_one(tmp_path, monkeypatch):
    """A second `clawray bench` into the same --out reused the first one's state (sessions, replay): its
    runs then counted the old turns as their own and timed out waiting for them to be scored (seen in
    `make bench` on 2026-12-05). Every (condition, seed) must start on an empty folder."""
    from core.config import load_config
    from harness import bench
    from tests.conftest import REPO

    seen = {}

    class Recording:  # the system itself is started in tests/integration/test_bench_harness.py
        def __init__(self, cfg, condition, seed, workload):
            seen["root"] = cfg.storage_path()
            seen["files"] = sorted(p.name for p in seen["root"].rglob("*") if p.is_file())

        def run(self, teacher=None):
            return {"condition": "baseline", "seed": 0, "days": [], "seconds": 0.0, "adapters": []}

    stale = tmp_path / "baseline-s0" / "state" / "sessions" / "sessions.db"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier bench's sessions")
    monkeypatch.setattr(bench, "Run", Recording)
    bench.run_one(load_config(None), REPO / "workloads" / "clawray-mini", "baseline", 0, tmp_path)
    assert seen["root"] == tmp_path / "baseline-s0" / "state"
    assert "sessions.db" not in seen["files"] and not stale.exists()
    assert (tmp_path / "baseline-s0.json").is_file()
