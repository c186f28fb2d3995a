"""`make demo`'s job: the whole loop closes on this machine and the demo says so.

Runs `clawray demo` as a user would (a subprocess with its own local Ray cluster, its own storage root and
port) and asserts every promised stage from the verdicts the demo writes.
It runs first in the session (tests/conftest.py RUN_FIRST), before the suite's own cluster exists.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.stages import STAGES

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _current_cluster() -> str | None:
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    return path.read_text() if path.exists() else None


def _listening(address: str) -> bool:
    host, _, port = address.strip().rpartition(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def test_demo_closes_the_loop_and_checks_every_stage(tmp_path):
    before = _current_cluster()
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLAWRAY__PROXY__PORT": str(_free_port())}
    # The whole workload: rounds cost ~1 s each, and the morning must hold failures with feedback.
    r = subprocess.run([sys.executable, "-m", "harness.cli", "demo", "--state", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=1200, env=env)
    out = r.stdout + r.stderr
    verdicts = json.loads((tmp_path / "demo-stages.json").read_text())["stages"]
    assert [v["stage"] for v in verdicts] == [s for s, _ in STAGES]
    failed = [f"{v['stage']}: {v['detail']}" for v in verdicts if not v["passed"]]
    assert not failed, out[-4000:]
    assert r.returncode == 0, out[-4000:]
    assert "every stage happened" in r.stdout
    # The run left nothing behind that breaks the next command (`serve run` joins Ray's current cluster):
    # no record of a cluster that is gone (another, live cluster's record may come and go meanwhile).
    record = _current_cluster()
    assert record is None or record == before or _listening(record), f"stale Ray cluster record {record}"
