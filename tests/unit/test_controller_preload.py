"""The Controller preloads the trainer at its start, off its event loop, unless it never trains.

Without it the first window's `_start` imported Ray Train, torch and the GRPO loop on the actor's event loop:
~3 s of the first window only (benchmarks/window_efficiency.py, the cold run), with every other call to
the Controller stalled meanwhile. With Ray up it also starts Ray's autoscaling coordinator (exercised by
every integration test that trains through the Controller) and the run's control actor where its name is
free (tests/integration/test_train_control.py).
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

    def preload(*args) -> None:
        calls.append((threading.current_thread().name, *args))
        ran.set()

    monkeypatch.setattr(controller_mod, "preload_trainer", preload)
    await make("skills_only")
    await make("rl", root="other")
    assert ran.wait(10)
    # once, for the Controller that trains, on its own thread, with its run's name and namespace
    assert calls == [("preload-trainer", controller_mod.RUN_NAME, "clawray")]


def test_preload_trainer_imports_the_training_job():
    code = ("import sys; from cluster.trainer_preload import preload_trainer; assert 'train.job' not in sys.modules; "
            "preload_trainer(); import ray; assert not ray.is_initialized(); "
            "assert 'train.grpo' in sys.modules and 'ray.train' in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=control.REPO, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(control.REPO)})
