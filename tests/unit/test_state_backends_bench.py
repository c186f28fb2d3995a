"""benchmarks/state_backends.py runs both backends through the stores' public APIs (a tiny run): every
sample appended is leased and committed, every measurement has a number, and the table renders."""

from __future__ import annotations

import argparse

from benchmarks.state_backends import BACKENDS, markdown, rows, run


def test_a_tiny_run_measures_both_backends_and_renders():
    args = argparse.Namespace(samples=300, batch=64, singles=5, lease_batch=32, prompt_tokens=16,
                              response_tokens=8, sessions=4, turns=2, quick=False)
    result = run(args)
    for backend in BACKENDS:
        replay, sessions = result[backend]["replay"], result[backend]["sessions"]
        assert replay["lease_cycle"]["samples"] == 300 + 5  # the drained buffer: batched and single appends
        assert sessions["group_commit"]["turns"] == 8 and sessions["one_per_commit"]["commit_latency"]["n"] == 8
    table = rows(result)
    assert len(table) == 9 and all(len(r) == 1 + len(BACKENDS) for r in table)
    md = markdown(result)
    assert "| Replay append, batches of 64: samples/s |" in md and "Goal: SQLite >= 5,000" in md
