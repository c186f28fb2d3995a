"""What was remembered, per user: for the demo's report, `clawray memory stats`, and operators.

`summary(storage_root, state=...)` reads the memory store of a storage root, or of the PostgreSQL state
(`state.dsn`), with no cluster needed; `summarize(store)` reads an open store; `render_markdown(summary)`
formats it. Superseded units are counted, never listed as current.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.storage import StorageLayout
from memory.open import open_memory_store
from memory.sqlite_store import DB_FILE
from memory.store import MemoryStore, UnitFilter


def summary(storage_root: str | Path, examples: int = 5, state: StateConfig | dict | None = None) -> dict[str, Any]:
    """`summarize` of the store the state config selects; empty when no SQLite store exists yet."""
    cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
    memory_dir = StorageLayout(Path(storage_root)).memory
    if (cfg is None or not cfg.dsn) and not (memory_dir / DB_FILE).is_file():
        return {"users": {}, "totals": {"units": 0}}
    store = open_memory_store(memory_dir, cfg)
    try:
        return summarize(store, examples)
    finally:
        store.close()


def summarize(store: MemoryStore, examples: int = 5) -> dict[str, Any]:
    """{"users": {user: {"units", "by_kind", "by_level", "superseded", "examples": [{kind, level, content}]}},
    "totals": store stats}."""
    users: dict[str, Any] = {}
    every = store.list_units(UnitFilter(include_superseded=True), limit=1_000_000)
    for u in every:
        row = users.setdefault(u.user, {"units": 0, "by_kind": {}, "by_level": {}, "superseded": 0,
                                        "examples": []})
        if not u.active:
            row["superseded"] += 1
            continue
        row["units"] += 1
        row["by_kind"][u.kind.value] = row["by_kind"].get(u.kind.value, 0) + 1
        row["by_level"][u.level.value] = row["by_level"].get(u.level.value, 0) + 1
    for user, row in users.items():
        best = store.list_units(UnitFilter(user=user), limit=200)
        best.sort(key=lambda u: (-u.confidence, -u.mentions, -u.updated_at))
        row["examples"] = [{"kind": u.kind.value, "level": u.level.value, "content": u.content}
                           for u in best[:examples]]
    return {"users": users, "totals": store.stats()}


def render_markdown(data: dict[str, Any]) -> str:
    """A Markdown section: one line of counts and the top units per user."""
    if not data["users"]:
        return "## Memory\n\nNothing remembered yet.\n"
    lines = ["## Memory", "", f"{data['totals']['units']} active unit(s) for {len(data['users'])} user(s).", ""]
    for user, row in sorted(data["users"].items()):
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(row["by_kind"].items()))
        lines.append(f"### {user}: {row['units']} unit(s) ({kinds}); {row['superseded']} superseded")
        lines += [f"- [{e['kind']}, {e['level']}] {e['content']}" for e in row["examples"]]
        lines.append("")
    return "\n".join(lines)
