"""benchmarks/window_efficiency.py's arithmetic: fixed costs from a run's step records, utilisation."""

import pytest

from benchmarks.window_efficiency import median_row, run_timings, utilisation


def test_fixed_costs_come_from_the_step_records_and_the_wall_clock():
    steps = [{"time": 130.0, "step_s": 8.0, "publish_s": 2.0}, {"time": 140.0, "step_s": 8.0, "publish_s": 2.0}]
    t = run_timings(100.0, 145.0, steps)
    assert t["to_first_step_s"] == 20.0  # 130 - 2 - 8 - 100
    assert (t["step_s"], t["swap_s"], t["tail_s"], t["fixed_s"]) == (8.0, 2.0, 5.0, 25.0)
    assert utilisation(t, 60.0) == pytest.approx(3 * 8 / 60)  # (60 - 25) // 10 = 3 steps
    assert utilisation(t, 20.0) == 0.0  # the fixed cost alone exceeds the window
    assert run_timings(0.0, 9.0, [])["steps"] == 0 and utilisation(run_timings(0.0, 9.0, []), 60) == 0.0


def test_several_warm_runs_get_a_median_row():
    runs = [run_timings(0.0, 10.0 + d, [{"time": 9.0 + d, "step_s": 1.0, "publish_s": 0.5}]) for d in (0.0, 3.0, 1.0)]
    for r in runs:
        r.update(run="warm", utilisation_60s=0.1, utilisation_1800s=0.2)
    m = median_row(runs)
    assert m["run"] == "warm median" and m["to_first_step_s"] == 8.5 and m["fixed_s"] == 9.5  # d = 1.0
