"""benchmarks/window_efficiency.py's arithmetic: fixed costs from a run's step records, utilisation."""

import pytest

from benchmarks.window_efficiency import run_timings, utilisation


def test_fixed_costs_come_from_the_step_records_and_the_wall_clock():
    steps = [{"time": 130.0, "step_s": 8.0, "publish_s": 2.0}, {"time": 140.0, "step_s": 8.0, "publish_s": 2.0}]
    t = run_timings(100.0, 145.0, steps)
    assert t["to_first_step_s"] == 20.0  # 130 - 2 - 8 - 100
    assert (t["step_s"], t["swap_s"], t["tail_s"], t["fixed_s"]) == (8.0, 2.0, 5.0, 25.0)
    assert utilisation(t, 60.0) == pytest.approx(3 * 8 / 60)  # (60 - 25) // 10 = 3 steps
    assert utilisation(t, 20.0) == 0.0  # the fixed cost alone exceeds the window
    assert run_timings(0.0, 9.0, [])["steps"] == 0 and utilisation(run_timings(0.0, 9.0, []), 60) == 0.0
