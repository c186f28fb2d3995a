"""`clawray report`: one PNG of how the meta-model evolved — rewards, skill generations, windows, adapters.

Reads the storage root directly (read-only): the replay database, the skill history, the controller's
history and the adapter manifests, so it works with the system stopped.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from core.storage import StorageLayout, read_json


def _ts(v: Any) -> float | None:
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def load_rewards(layout: StorageLayout) -> list[dict[str, Any]]:
    db = layout.replay / "replay.sqlite"  # train.replay.DB_FILE (read-only here)
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT created_at, state, generation, payload FROM samples ORDER BY created_at")
        out = []
        for created, state, gen, payload in rows:
            p = json.loads(payload)
            out.append({"t": created, "state": state, "generation": gen, "reward": p.get("reward", 0.0),
                        "adapter": p.get("adapter_version")})
        return out
    finally:
        con.close()


def load_generations(layout: StorageLayout) -> list[tuple[float, int]]:
    path = layout.skills / "history.jsonl"
    if not path.exists():
        return []
    pts = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        t = _ts(rec.get("ts"))
        if t is not None:
            pts.append((t, int(rec.get("generation", 0))))
    return sorted(pts)


def load_windows(layout: StorageLayout) -> list[tuple[float, float | None, dict]]:
    hist = (read_json(layout.control / "controller.json", {}) or {}).get("history", [])
    spans, start = [], None
    for ev in hist:
        if ev["event"] == "run_started":
            start = ev
        elif ev["event"] == "run_finished" and start is not None:
            spans.append((start["at"], ev["at"], ev))
            start = None
    if start is not None:
        spans.append((start["at"], None, start))
    return spans


def load_adapters(layout: StorageLayout) -> list[tuple[float, str]]:
    out = []
    for m in sorted(layout.adapters.glob("policy-v*/manifest.json")):
        data = read_json(m, {}) or {}
        out.append((float(data.get("created_at", m.stat().st_mtime)), data.get("name", m.parent.name)))
    return sorted(out)


def rolling_mean(values: list[float], window: int = 8) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def write_report(storage_root: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = StorageLayout(storage_root)
    rewards = load_rewards(layout)
    gens = load_generations(layout)
    windows = load_windows(layout)
    adapters = load_adapters(layout)
    times = [r["t"] for r in rewards] + [t for t, _ in gens] + [t for t, _ in adapters]
    t0 = min(times) if times else 0.0

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=[3, 1.4])
    if rewards:
        xs = [(r["t"] - t0) / 60 for r in rewards]
        ys = [r["reward"] for r in rewards]
        colors = ["tab:gray" if r["state"] in ("retired", "support", "masked") else "tab:blue" for r in rewards]
        ax1.scatter(xs, ys, s=12, c=colors, alpha=0.6, label="sample reward (grey: retired/support/masked)")
        ax1.plot(xs, rolling_mean(ys), color="tab:red", lw=2, label="rolling mean (8)")
    for start, end, _ in windows:
        x1 = (start - t0) / 60
        x2 = ((end or max(times or [start])) - t0) / 60
        for ax in (ax1, ax2):
            ax.axvspan(x1, max(x2, x1 + 0.05), color="tab:green", alpha=0.15)
    for i, (t, name) in enumerate(adapters):
        ax1.axvline((t - t0) / 60, color="tab:purple", ls="--", lw=1)
        ax1.annotate(name, ((t - t0) / 60, 1.02 + 0.06 * (i % 2)), xycoords=("data", "axes fraction"),
                     fontsize=8, color="tab:purple", ha="center")
    ax1.set_ylabel("reward")
    ax1.set_title("clawray: reward, training windows (green) and adapter versions (purple)", pad=28)
    ax1.legend(loc="lower right", fontsize=8)
    if gens:
        gx = [0.0] + [(t - t0) / 60 for t, _ in gens]
        gy = [0] + [g for _, g in gens]
        ax2.step(gx, gy, where="post", color="tab:orange")
    ax2.set_ylabel("skill generation")
    ax2.set_xlabel("minutes since first event")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
