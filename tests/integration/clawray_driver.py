"""A real clawray of a test's own, started as `clawray demo` starts its own: on a new local Ray cluster.

Run as a subprocess by tests/integration/test_agents_live.py:
    python -m tests.integration.clawray_driver READY_JSON

`start_system` with configs/local.yaml and the environment's overrides (CLAWRAY__..., the storage root, the
port, the context length). Once the app answers it writes READY_JSON: the base URL and the Ray session
folder (the test checks that no process of that cluster outlives it). Then it waits for EOF on stdin: the
test closes the pipe when it is done, and so does its death. Then `stop_system` deletes the app and the
named actors and leaves Ray, which ends the local cluster's processes.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "token")  # before Ray is imported, as `clawray start` runs it

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from core.config import load_config  # noqa: E402


def main() -> int:
    ready = Path(sys.argv[1])
    from cluster.system import start_system, stop_system

    cfg = load_config(None)
    try:
        system = start_system(cfg)
        import ray

        session = ray._private.worker._global_node.get_session_dir_path()
        tmp = ready.with_suffix(".tmp")
        tmp.write_text(json.dumps({"base_url": system.base_url, "ray_session_dir": session}))
        tmp.replace(ready)
        sys.stdin.read()  # until the test closes the pipe (or dies)
    finally:
        stop_system(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
