"""Does the loop help: `clawray bench` on the project's own workload with the instruction-following model.

    python -m benchmarks.efficacy [--quick] [--seeds 10] [--conditions baseline,skills,full,batchnorm]

Every (condition, seed) runs on a fresh system (harness/bench.py): baseline (the bare model), skills (the
fast loop), full (skills + an RL window every evening on re-sampled GRPO groups) and batchnorm (the same
window on the turns as served, batch-normalised). Writes benchmarks/out/efficacy.json (the bench's own summary and ordering checks) and
efficacy.md (the table, the claims, the PNG) for RESULTS.md; the PNG goes to benchmarks/img/efficacy.png.
`--quick`: 2 seeds, the first 4 rounds of each day. Needs `make instruct-model`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
IMG = REPO / "benchmarks" / "img" / "efficacy.png"
WORKLOAD = REPO / "workloads" / "clawray-mini"
CONDITIONS = "baseline,skills,full,batchnorm"


def markdown(result: dict[str, Any], png: str) -> str:
    def cell(m: float, ci: float | None) -> str:
        return f"{m:.3f}" + (f" ± {ci:.3f}" if ci is not None else "")

    rows = ["| condition | accuracy | completion | skills (last day) | adapters (last day) |", "|---|---|---|---|---|"]
    for cond, s in result["summary"].items():
        o, last = s["overall"], s["days"][-1]
        rows.append(f"| {cond} | {cell(o['accuracy'], o['accuracy_ci'])} | {cell(o['completion'], o['completion_ci'])}"
                    f" | {last['skills']:.1f} | {last['adapters']:.1f} |")
    claims = [f"- {o['lower']} < {o['higher']}: gap {o['gap']:+.3f}, paired CI {o['ci']:.3f}"
              + (f" (unpaired {o['ci_unpaired']:.3f})" if o.get("ci_unpaired") is not None else "")
              + f" -> {'holds' if o['holds'] else 'does not hold'}" if o["ci"] is not None else
              f"- {o['lower']} < {o['higher']}: gap {o['gap']:+.3f} (one seed: no interval)"
              for o in result["ordering"]]
    return "\n".join([
        f"# efficacy\n\n`clawray bench` on {result['workload']} with model {result['model']}, seeds "
        f"{result['seeds']} (mean ± 95% Student-t interval over seeds), each run on a fresh system.\n",
        *rows, "", "Claims (a gap holds when it is larger than the 95% interval of the per-seed differences: the runs of a "
        "seed replay the same sessions with the same sampling seeds; unpaired: the sum of the two intervals):", "", *claims, "",
        f"![accuracy per day and condition]({png})", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--conditions", default=CONDITIONS)
    ap.add_argument("--model", default="tiny-instruct")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from harness.bench import parse_conditions, run_bench

    seeds = a.seeds or (2 if a.quick else 10)
    out = OUT / "efficacy"
    result = run_bench(WORKLOAD, parse_conditions(a.conditions), seeds, out, model=a.model,
                       rounds=4 if a.quick else None)
    IMG.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "bench.png", IMG)
    keep = {k: result[k] for k in ("workload", "model", "conditions", "seeds", "rounds_per_day", "summary", "ordering")}
    (OUT / "efficacy.json").write_text(json.dumps(keep, indent=2))
    (OUT / "efficacy.md").write_text(markdown(result, "img/efficacy.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
