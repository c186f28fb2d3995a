"""benchmarks/RESULTS.md is rendered from the benchmarks' JSON: machine header, headline ratios, missing and
failed runs reported, an output whose shape changed shown raw instead of crashing the report."""

from __future__ import annotations

from benchmarks.report import machine_info, render
from benchmarks.run_all import BENCHES, Bench

TRAINER = {"rows": [
    {"shape": "8x(32+32)", "impl": impl, "step_s_min": 0.1, "step_s_median": 0.12, "tokens_per_s": tps,
     "peak_rss_mb": rss, "speedup_vs_trl": tps / 1000, "peak_rss_vs_trl": rss / 900}
    for impl, tps, rss in (("trl", 1000.0, 900.0), ("clawray", 2500.0, 700.0))]}


def test_report_has_machine_headlines_and_every_run():
    runs = [{"name": "trainer", "status": "ok", "wall_s": 12.0, "args": ["--quick"],
             "outputs": {"trainer.json": TRAINER}},
            {"name": "hotswap", "status": "missing", "detail": "benchmarks/hotswap.py does not exist"},
            {"name": "retrieval", "status": "failed", "wall_s": 3.0, "args": [], "detail": "boom | x"}]
    md = render(runs, machine_info(), quick=True, command="python -m benchmarks.run_all --quick")
    assert "| cores |" in md and "| cpu |" in md and "torch" in md and "Quick mode" in md
    assert "clawray 2.50× trl's tokens/s at 0.78× its peak memory" in md
    assert "| hotswap | missing |" in md and "| retrieval | failed |" in md and "boom \\| x" in md
    assert "## trainer" in md and "## retrieval" not in md


def test_an_output_of_another_shape_is_shown_raw_not_fatal():
    runs = [{"name": "trainer", "status": "ok", "wall_s": 1.0, "args": [],
             "outputs": {"trainer.json": {"rows": [{"shape": "x"}], "total_s": 4.5}}}]
    md = render(runs, machine_info(), quick=False, command="x")
    assert "renderer failed: KeyError" in md and "| total_s | 4.5" in md


def test_quick_falls_back_when_a_benchmark_has_no_quick_flag():
    b = next(b for b in BENCHES if b.name == "proxy_overhead")
    args = b.args(quick=True)
    assert "--port" in args and (("--quick" in args) or ("--no-real" in args))
    assert Bench("hotswap").args(quick=True) == ["--quick"] and Bench("trainer").args(quick=False) == []


def _point(p50: float, rps: float) -> dict:
    return {"p50_ms": p50, "rps": rps}


def test_proxy_target_verdict_follows_the_issue():
    """<= 1 ms over direct, or <= 1.5x the floor when the hop alone costs more; >= 90% req/s at c=64."""
    from benchmarks.proxy_overhead import _target

    direct, floor = _point(10.0, 200.0), _point(15.0, 150.0)
    assert _target("fake", 1, direct, floor, _point(10.9, 190.0)) == "p50 met"
    assert _target("fake", 1, direct, floor, _point(22.0, 190.0)) == "p50 met"  # 1.47x the floor
    assert _target("fake", 1, direct, floor, _point(23.0, 190.0)) == "p50 missed"
    assert _target("fake", 64, direct, floor, _point(12.0, 181.0)) == "p50 met, req/s met"
    assert _target("fake", 64, direct, floor, _point(12.0, 179.0)) == "p50 met, req/s missed"
    cheap_hop = _point(10.5, 190.0)  # the hop costs < 1 ms: only "+1 ms over direct" counts
    assert _target("fake", 1, direct, cheap_hop, _point(12.0, 190.0)) == "p50 missed"
    assert _target("tiny", 64, direct, floor, _point(99.0, 1.0)) == ""  # the target is for the instant engine


def test_proxy_headlines_name_the_layout_and_the_verdict():
    from benchmarks.report import proxy_overhead

    row = {"engine": "fake", "c": 64, "path": "colocated", "added_p50_vs_direct_ms": 0.5, "p50_over_floor": 0.7,
           "rps_vs_direct": 0.94, "rps_vs_floor": 1.3, "target": "p50 met, req/s met"}
    _, heads = proxy_overhead({"meta": {"mode": "default Serve HTTP proxy"}, "rows": [],
                               "summary": [row, {**row, "c": 16}, {**row, "engine": "tiny"}]})
    assert heads == ["Ingress overhead, co-located (default) (default Serve HTTP proxy, fake engine, c=64): "
                     "+0.5 ms p50 vs the engine served directly, 0.70× the p50 of an empty pass-through ingress, "
                     "130% of its throughput, 94% of direct throughput — target p50 met, req/s met"]
