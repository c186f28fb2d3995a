"""The demo's self-check: each promised stage is judged on its own evidence, in loop order."""

from __future__ import annotations

import pytest

from harness.stages import STAGES, Evidence, evaluate, first_failure


def closed_loop() -> Evidence:
    return Evidence(serving=True, day1_turns=20, day1_scored=20, day1_observed=20, generation_before=0,
                    generation_after=1, skills_after=3, support=5, fresh_before_window=9, min_fresh_samples=4,
                    steps=2, trained_ids=["a", "b"], adapters=["policy-v0001", "policy-v0002"],
                    active_after_window="policy-v0002", day2_adapters=["policy-v0002"] * 4,
                    users=["mei", "raj"], memory_by_user={"mei": 3, "raj": 1},
                    collective_sessions=["mei-day01", "raj-day01"], collective_groups=2,
                    collective_decisions=["x: refine -> rejected by the gate: ...", "(no skill): skip -> ..."],
                    collective_on_off={u: {"day01": 0.4, "day02": 0.6, "day02_on": 0.6, "day02_off": 0.5}
                                       for u in ("mei", "raj")})


def test_a_closed_loop_passes_every_stage_in_order():
    verdicts = evaluate(closed_loop())
    assert [v.stage for v in verdicts] == [s for s, _ in STAGES]
    assert all(v.passed for v in verdicts) and first_failure(verdicts) is None


@pytest.mark.parametrize("change, stage", [
    ({"serving": False}, "serving"),
    ({"day1_scored": 19}, "scoring"),
    ({"day1_observed": 0}, "scoring"),
    ({"generation_after": 0}, "skills_evolved"),
    ({"support": 0}, "skills_evolved"),
    ({"fresh_before_window": 3}, "query_samples"),
    # what the first demo did: a window with nothing to train, and still "finished"
    ({"steps": 0, "trained_ids": [], "adapters": [], "active_after_window": None, "day2_adapters": [None]},
     "grpo_steps"),
    ({"run_error": "RuntimeError: boom"}, "grpo_steps"),
    ({"trained_violations": ["a"]}, "separation"),
    ({"active_after_window": "policy-v0001"}, "hot_swap"),
    ({"day2_adapters": ["policy-v0002", None]}, "next_day"),
    ({"memory_by_user": {"mei": 3}}, "memory"),  # raj remembered nothing
    ({"memory_by_user": {"mei": 3, "raj": 1, "default": 2}}, "memory"),  # units outside the users' scopes
    ({"collective_sessions": None}, "collective"),  # the job never ran
    ({"collective_sessions": ["mei-day01"]}, "collective"),  # raj's session was not read
    ({"collective_decisions": []}, "collective"),
    ({"collective_on_off": {}}, "collective"),  # day 2 was never measured with the loop on and off
    ({"collective_on_off": {"mei": {"day01": 0.4, "day02": 0.6, "day02_on": 0.6, "day02_off": 0.5},
                            "raj": {"day01": 0.4, "day02": 0.6, "day02_on": None, "day02_off": None}}},
     "collective"),
])
def test_a_missing_stage_is_named(change, stage):
    ev = closed_loop()
    for k, v in change.items():
        setattr(ev, k, v)
    failed = first_failure(evaluate(ev))
    assert failed is not None and failed.stage == stage, failed


def test_a_window_that_trained_nothing_says_why():
    """CI once saw only "0 steps, 0 samples trained": the verdict names the cause and the evening."""
    ev = closed_loop()
    ev.steps, ev.trained_ids, ev.window_opened = 0, [], False
    ev.evening = ["OMLS now idle_wait, last activity 2026-12-01T07:09:00+00:00"]
    grpo = next(v for v in evaluate(ev) if v.stage == "grpo_steps")
    assert not grpo.passed
    assert "no window opened" in grpo.detail and "OMLS now idle_wait" in grpo.detail
    ev.window_opened, ev.run_stop_reason = True, "stop_requested"
    ev.evening = ["+31s run_started reason=window", "+40s run_finished reason=window stop_reason=stop_requested"]
    grpo = next(v for v in evaluate(ev) if v.stage == "grpo_steps")
    assert "run ended: stop_requested" in grpo.detail and "+40s run_finished" in grpo.detail


def test_the_on_off_plot_has_a_bar_per_user_and_measure(tmp_path):
    from harness.plots import plot_on_off

    rows = closed_loop().collective_on_off
    png = plot_on_off(rows, tmp_path / "collective.png", ["backup-first"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
