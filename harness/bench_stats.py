"""Pure statistics of `clawray bench`: per-day and overall means over seeds, confidence intervals, the
ordering checks (baseline < skills < full, batchnorm < full, full < opd) and the PNG. No Ray, no I/O besides the plot.

A run (one condition, one seed) is a dict {"condition", "seed", "days": [{"day", "accuracy",
"completion", "rounds", "samples", "skills", "adapters"}]}: accuracy is the mean round score of the day,
completion the fraction of its rounds fully correct (MetaClaw-Bench's two numbers).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONFIDENCE = 0.95
ORDER = ("baseline", "skills", "batchnorm", "full", "opd")
# The claims checked: MetaClaw's chain baseline < skills < full over the conditions that ran, that full's
# re-sampled GRPO groups beat batch normalisation (batchnorm < full), and that on-policy distillation adds to
# full (full < opd).
CHAIN = ("baseline", "skills", "full")
BELOW_FULL = ("batchnorm",)
ABOVE_FULL = ("opd",)


def claims(present) -> list[tuple[str, str]]:
    chain = [c for c in CHAIN if c in present]
    out = list(zip(chain, chain[1:], strict=False))
    if "full" in present:
        out += [(c, "full") for c in BELOW_FULL if c in present] + [("full", c) for c in ABOVE_FULL if c in present]
    return out


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float | None]:
    """(mean, half-width of the two-sided Student-t interval of the mean); None for fewer than 2 values."""
    from scipy import stats  # the t quantile; scipy comes with the training stack

    vals = [float(v) for v in values]
    if not vals:
        return math.nan, None
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, None
    half = stats.t.ppf((1 + confidence) / 2, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, float(half)


def overall(run: dict[str, Any]) -> dict[str, float]:
    """A run's totals over its days, rounds-weighted (a day with more rounds counts more)."""
    days = run["days"]
    n = sum(d["rounds"] for d in days)
    if not n:
        return {"accuracy": math.nan, "completion": math.nan}
    return {"accuracy": sum(d["accuracy"] * d["rounds"] for d in days) / n,
            "completion": sum(d["completion"] * d["rounds"] for d in days) / n}


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per condition: per day and overall mean and CI over the seeds, plus the last day's samples, skills
    and adapters (means)."""
    out: dict[str, Any] = {}
    for cond in dict.fromkeys(r["condition"] for r in runs):
        mine = [r for r in runs if r["condition"] == cond]
        days = [d["day"] for d in mine[0]["days"]]
        per_day = []
        for i, day in enumerate(days):
            rows = [r["days"][i] for r in mine if len(r["days"]) > i]
            row: dict[str, Any] = {"day": day}
            for key in ("accuracy", "completion"):
                row[key], row[f"{key}_ci"] = mean_ci([x[key] for x in rows])
            for key in ("samples", "skills", "adapters"):
                row[key] = statistics.fmean(x[key] for x in rows)
            per_day.append(row)
        tot: dict[str, Any] = {"seeds": sorted(r["seed"] for r in mine)}
        for key in ("accuracy", "completion"):
            tot[key], tot[f"{key}_ci"] = mean_ci([overall(r)[key] for r in mine])
        out[cond] = {"days": per_day, "overall": tot}
    return out


def paired_gaps(runs: Sequence[dict[str, Any]], lo: str, hi: str, key: str = "accuracy") -> list[float]:
    """Per seed that ran both conditions, `hi`'s overall `key` minus `lo`'s (in seed order)."""
    by = {(r["condition"], r["seed"]): overall(r)[key] for r in runs}
    seeds = sorted({s for c, s in by if c == lo} & {s for c, s in by if c == hi})
    return [by[(hi, s)] - by[(lo, s)] for s in seeds]


def ordering(summary: dict[str, Any], key: str = "accuracy",
             runs: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """For each claim among the conditions present (`claims`: baseline < skills < full, batchnorm <
    full, full < opd): the gap of the overall means and whether it is larger than its confidence interval.

    The runs of one seed are paired: every condition replays the same sessions with the same sampling
    seeds (harness/driver.py `request_seed`), so what differs between them is the condition. With `runs`,
    the interval of a gap is the Student-t interval of the per-seed differences (`ci`), the interval of a
    paired design. `ci_unpaired` is the overlap criterion (the sum of the two conditions' half-widths),
    which ignores the pairing and is more conservative; both are reported, the claim is judged on `ci`
    (on `ci_unpaired` without `runs`). With one seed there is no interval and `holds` is None."""
    out = []
    for lo, hi in claims(summary):
        a, b = summary[lo]["overall"], summary[hi]["overall"]
        gap = b[key] - a[key]
        unpaired = None if a[f"{key}_ci"] is None or b[f"{key}_ci"] is None else a[f"{key}_ci"] + b[f"{key}_ci"]
        ci = unpaired
        if runs is not None:
            diffs = paired_gaps(runs, lo, hi, key)
            ci = mean_ci(diffs)[1] if diffs else None
        out.append({"lower": lo, "higher": hi, "gap": gap, "ci": ci, "ci_unpaired": unpaired,
                    "holds": None if ci is None else bool(gap > ci)})
    return out


def plot(summary: dict[str, Any], path: Path, title: str) -> Path:
    """Accuracy per day per condition (mean over seeds, CI bars) and the overall accuracy and completion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 1.4]})
    for j, (cond, s) in enumerate(summary.items()):  # nudged apart: equal conditions stay visible
        xs = [i + 0.06 * (j - (len(summary) - 1) / 2) for i in range(len(s["days"]))]
        ys = [d["accuracy"] for d in s["days"]]
        err = [d["accuracy_ci"] or 0.0 for d in s["days"]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=cond)
    first = next(iter(summary.values()))["days"] if summary else []
    ax.set_xticks(range(len(first)), [d["day"] for d in first], rotation=45 if len(first) > 6 else 0)
    ax.set_xlabel("day")
    ax.set_ylabel("accuracy (mean round score)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.set_title(title)
    conds = list(summary)
    width = 0.38
    for j, key in enumerate(("accuracy", "completion")):
        vals = [summary[c]["overall"][key] for c in conds]
        errs = [summary[c]["overall"][f"{key}_ci"] or 0.0 for c in conds]
        bx.bar([i + (j - 0.5) * width for i in range(len(conds))], vals, width, yerr=errs, capsize=3, label=key)
    bx.set_xticks(range(len(conds)), conds)
    bx.set_ylim(0, 1.02)
    bx.legend(fontsize=8)
    bx.set_title("overall (95% CI over seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
