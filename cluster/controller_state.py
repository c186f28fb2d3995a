"""Where the Controller (cluster/controller.py) keeps its state, and reading it from outside the actor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.config import StateConfig
from core.kv import CONTROL_FILE, control_store
from core.storage import StorageLayout, read_json

STATE_KEY = "controller"  # in the control store
LEGACY_FILE = "controller.json"  # under control/: where releases before the control store kept the state


def read_controller_state(storage_root: Path, state: StateConfig | dict | None = None) -> dict[str, Any]:
    """The Controller's persisted state (runs, history, current) for readers such as `cluster.report`:
    the control store's, else an older release's `control/controller.json` (read, not adopted: only the
    Controller moves it). An embedded store that does not exist yet is not created."""
    cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
    control = StorageLayout(Path(storage_root)).control
    if (cfg is not None and cfg.dsn) or (control / CONTROL_FILE).exists():
        store = control_store(storage_root, cfg)
        try:
            got = store.get(STATE_KEY)
        finally:
            store.close()
        if got is not None:
            return got[1]
    return read_json(control / LEGACY_FILE, {}) or {}
