"""PNGs of the demo's results that people would rather look at than a table (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

ON_OFF_BARS = (("day01", "day 1 (before any collective run)"), ("day02", "day 2 served (loop on)"),
               ("day02_on", "day 2 replayed: on"), ("day02_off", "day 2 replayed: off"))


def plot_on_off(rows: dict[str, dict[str, float | None]], path: Path, published: list[str]) -> Path:
    """Per user, the mean reward of day 1, of day 2 as served, and of day 2's tasks replayed with the
    night's collective publishes on and undone (harness/demo.py `Demo.on_off`); a missing value is no bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    users = list(rows)
    fig, ax = plt.subplots(figsize=(max(7.0, 2.2 * len(users)), 4.8))
    width = 0.8 / len(ON_OFF_BARS)
    for j, (key, label) in enumerate(ON_OFF_BARS):
        xs = [i + (j - (len(ON_OFF_BARS) - 1) / 2) * width for i in range(len(users))]
        vals = [rows[u].get(key) for u in users]
        ax.bar([x for x, v in zip(xs, vals, strict=True) if v is not None], [v for v in vals if v is not None],
               width, label=label)
    ax.set_xticks(range(len(users)), users)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean reward")
    what = f"night 1 published {', '.join(published)}" if published else "night 1 published nothing: on = off"
    ax.set_title(f"collective loop on vs off, per user\n{what}", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
