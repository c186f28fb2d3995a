"""`ray.prestart_workers` (cluster/runtime.py `local_system_config`): a cluster clawray starts prestarts no idle
Python workers unless asked to (they held ~46 MB PSS each and nothing of clawray's used them).

Each case starts a real local cluster through `start_ray` in a subprocess of its own and counts the driver's
descendant processes titled `ray::IDLE`. The case with prestarting on runs first, so the test sees idle
workers appear and how long that takes; the case without then waits twice as long (at least 3 s) after
an actor round trip before it counts none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.config import REPO_ROOT

pytestmark = pytest.mark.slow

CHILD = r"""
import json, sys, time, psutil
from cluster.runtime import start_ray
from core.config import REPO_ROOT, load_config
prestart, wait_s = sys.argv[1] == "1", float(sys.argv[2])
cfg = load_config(REPO_ROOT / "configs" / "local.yaml", env={})
cfg = cfg.model_copy(update={"storage_root": sys.argv[3],
                             "ray": cfg.ray.model_copy(update={"prestart_workers": prestart, "num_cpus": 2})})
ray = start_ray(cfg)

def idle():
    return sum("ray::IDLE" in " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
               if p.is_running())

@ray.remote(num_cpus=0)
class Probe:
    def ping(self):
        return 1

t0 = time.monotonic()
assert ray.get(Probe.remote().ping.remote()) == 1
if prestart:
    while idle() == 0 and time.monotonic() - t0 < 60:
        time.sleep(0.1)
else:
    time.sleep(wait_s)
print(json.dumps({"idle": idle(), "seen_after_s": time.monotonic() - t0}))
ray.shutdown()
"""


def _idle_workers(prestart: bool, wait_s: float, tmp_path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, "1" if prestart else "0", str(wait_s), str(tmp_path)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cluster_clawray_starts_prestarts_no_idle_workers_unless_configured(tmp_path):
    on = _idle_workers(True, 0, tmp_path / "on")
    assert on["idle"] >= 1  # Ray's default, kept by `ray.prestart_workers: true`
    off = _idle_workers(False, max(3.0, 2 * on["seen_after_s"]), tmp_path / "off")
    assert off["idle"] == 0, off

