"""`clawray report`: one PNG of how the meta-model evolved — rewards, skill generations, windows, adapters.

Reads the state directly (read-only), so it works with the system stopped: the replay database (the
SQLite file under the storage root, or the PostgreSQL schema when `state.dsn` is set), the skill
history, the controller's history and the adapter manifests.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.storage import StorageLayout, read_json

REWARDS_SQL = "SELECT created_at, state, generation, payload FROM samples ORDER BY created_at"


def _ts(v: Any) -> float | None:
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def load_rewards(layout: StorageLayout, state: StateConfig | dict | None = None) -> list[dict[str, Any]]:
    cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
    db = layout.replay / "replay.sqlite"  # train.replay.DB_FILE (read-only here)
    if cfg is not None and cfg.dsn:
        from train.replay_schema import open_replay_db

        pg = open_replay_db(db, cfg)
        try:
            with pg.tx() as c:
                rows = c.execute(REWARDS_SQL).fetchall()
        finally:
            pg.close()
    elif db.exists():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute(REWARDS_SQL).fetchall()
        finally:
            con.close()
    else:
        return []
    out = []
    for created, st, gen, payload in rows:
        p = json.loads(payload)
        out.append({"t": created, "state": st, "generation": gen, "reward": p.get("reward", 0.0),
                    "adapter": p.get("adapter_version")})
    return out


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


def load_windows(layout: StorageLayout,
                 state: StateConfig | dict | None = None) -> list[tuple[float, float | None, dict]]:
    from cluster.controller_state import read_controller_state

    hist = read_controller_state(layout.root, state).get("history", [])
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


def write_report(storage_root: Path, out: Path, state: StateConfig | dict | None = None) -> Path:
    """The PNG at `out`; `state`: the config's `state` section (where the replay buffer lives)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = StorageLayout(storage_root)
    rewards = load_rewards(layout, state)
    gens = load_generations(layout)
    windows = load_windows(layout, state)
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
