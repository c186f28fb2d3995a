"""The Controller preloads the trainer at its start, off its event loop, unless it never trains.

Without it the first window's `_start` imported Ray Train, torch and the GRPO loop on the actor's event loop:
~3 s of the first window only (benchmarks/window_efficiency.py, the cold run), with every other call to
the Controller stalled meanwhile. With Ray up it also starts Ray's autoscaling coordinator (exercised by
every integration test that trains through the Controller). Not the run's control actor: a restarted
Controller took its killed incarnation's dying one (cluster/trainer_preload.py; test_controller_windows.py
failed on it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from cluster import controller as controller_mod
from tests.unit import test_invariant_control as control

system = control.system  # the fakes' fixture, shared


async def test_the_controller_preloads_the_trainer_unless_it_never_trains(system, monkeypatch):
    make, _, _ = system
    calls: list[str] = []
    ran = threading.Event()

    def preload() -> None:
        calls.append(threading.current_thread().name)
        ran.set()

    monkeypatch.setattr(controller_mod, "preload_trainer", preload)
    await make("skills_only")
    await make("rl", root="other")
    assert ran.wait(10)
    assert calls == ["preload-trainer"]  # once, for the Controller that trains, on its own thread


def test_preload_trainer_imports_the_training_job():
    code = ("import sys; from cluster.trainer_preload import preload_trainer; assert 'train.job' not in sys.modules; "
            "preload_trainer(); import ray; assert not ray.is_initialized(); "
            "assert 'train.grpo' in sys.modules and 'ray.train' in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=control.REPO, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(control.REPO)})
