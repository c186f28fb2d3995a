"""One GPU for the engine and the trainer (issue 14 item 3): the Controller's sequencing of a window's
sleep, run, publish and wake (cluster/controller.py with cluster/gpu_share.py), over the real engine code
with the fakes of tests/unit/test_gpu_share.py (which says what they stand for and why)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.test_gpu_share import make_engine, one_gpu_config, publish, trainer_publishes

# ---- the Controller's sequencing ------------------------------------------------------------------------


class FakeOMLS:
    def __init__(self) -> None:
        self.state, self.told = "idle_wait", []

    async def call(self, method: str) -> Any:
        if method == "state":
            return {"state": self.state}
        if method == "pending_actions":
            return []
        self.told.append(method)
        return None


class FakeJobs:
    """`train.job.TrainJob` as the Controller uses it; the test ends each run and makes its steps publish."""

    def __init__(self) -> None:
        self.made: list[FakeJobs.Job] = []
        self.fail_start: Exception | None = None
        jobs = self

        class Job:
            def __init__(self, cfg, **kw) -> None:
                self.running, self.result, self.stop_requested = False, None, False
                jobs.made.append(self)

            def start(self) -> None:
                if jobs.fail_start is not None:
                    raise jobs.fail_start
                self.running = True

            def request_stop(self) -> None:
                self.stop_requested = True

            def wait(self, timeout=None):
                return self.result

            def status(self) -> dict:
                return {"state": "running" if self.running else "idle"}

        self.Job = Job

    def end(self, stop_reason: str = "max_steps", error: str | None = None, adapters: tuple = ()) -> None:
        from train.job import TrainResult

        job = self.made[-1]
        steps = [{"sample_ids": [f"s{i}"], "adapter": a} for i, a in enumerate(adapters)]
        job.result = TrainResult(run_name="grpo", steps=steps, checkpoint=None, stop_reason=stop_reason,
                                 error=error, adapters=list(adapters))
        job.running = False


@pytest.fixture
def rig(tmp_path, monkeypatch):
    """A real ControllerActor wired to a real PolicyEngineImpl over the fake vLLM, a fake OMLS and fake
    training jobs."""
    from cluster.controller import ControllerActor

    jobs = FakeJobs()
    monkeypatch.setattr("train.job.TrainJob", jobs.Job)
    cfg = one_gpu_config(tmp_path)
    engine, fake = make_engine(cfg.storage_path())
    omls = FakeOMLS()

    def controller() -> ControllerActor:
        # Built in a thread of its own: on an event loop the constructor would start its control loop,
        # and here only the test ticks.
        with ThreadPoolExecutor(1) as pool:
            ctl = pool.submit(ControllerActor, cfg.model_dump(mode="json"), 1.0, None).result()
        assert ctl._loop is None
        ctl._omls = omls.call
        ctl._engine_call = lambda method: getattr(engine, method)()  # the deployment handle's call
        return ctl

    return SimpleNamespace(controller=controller, engine=engine, vllm=fake, omls=omls, jobs=jobs,
                           root=cfg.storage_path())


def sequence(ctl) -> list[str]:
    keep = {"engine_slept", "run_started", "run_finished", "engine_woken"}
    return [h["event"] for h in ctl.history if h["event"] in keep]


def test_a_window_sleeps_the_engine_trains_publishes_then_wakes_it_onto_the_new_adapter(rig):
    async def scenario() -> None:
        ctl = rig.controller()
        rig.omls.state = "window_open"
        await ctl.tick()
        assert await rig.engine.is_sleeping() and rig.jobs.made[-1].running
        assert sequence(ctl) == ["engine_slept", "run_started"] and rig.omls.told == ["training_started"]
        assert ctl.store.get("controller")[1]["engine_slept"]["reason"] == "window"  # persisted
        v1 = publish(rig.root, 1)
        await trainer_publishes(rig.engine, v1, rig.root)  # a step publishes while the engine sleeps
        rig.omls.state = "updating"
        await ctl.tick()
        assert await rig.engine.is_sleeping()  # the run trains on
        rig.jobs.end(adapters=(v1,))
        await ctl.tick()
        assert not await rig.engine.is_sleeping()
        assert sequence(ctl) == ["engine_slept", "run_started", "run_finished", "engine_woken"]
        assert rig.vllm.calls == [("sleep",), ("wake_up",), ("add_lora", v1)]
        assert (await rig.engine.models())["active"] == v1
        assert ctl.store.get("controller")[1]["engine_slept"] is None

    asyncio.run(scenario())


def test_a_failed_run_wakes_the_engine(rig):
    async def scenario() -> None:
        ctl = rig.controller()
        rig.omls.state = "window_open"
        await ctl.tick()
        rig.omls.state = "updating"
        rig.jobs.end(stop_reason="error", error="RuntimeError: CUDA error")
        await ctl.tick()
        assert not await rig.engine.is_sleeping()
        assert sequence(ctl)[-2:] == ["run_finished", "engine_woken"]

    asyncio.run(scenario())


def test_users_returning_stop_the_run_and_the_engine_wakes_once_it_has_stopped(rig):
    async def scenario() -> None:
        ctl = rig.controller()
        rig.omls.state = "window_open"
        await ctl.tick()
        rig.omls.state = "pausing"  # the user is back: OMLS asks for the stop
        request = asyncio.ensure_future(rig.engine.chat({"model": "clawray-policy"}))
        await ctl.tick()
        assert rig.jobs.made[-1].stop_requested and await rig.engine.is_sleeping()  # until the step boundary
        assert not request.done()  # the user's request waits for the GPU
        rig.jobs.end(stop_reason="stop_requested")
        await ctl.tick()
        assert (await request).body["model"] == "clawray-base"
        assert rig.vllm.calls == [("sleep",), ("wake_up",), ("chat", "clawray-base")]

    asyncio.run(scenario())


def test_a_controller_restarted_mid_window_wakes_the_engine_its_predecessor_put_to_sleep(rig):
    async def scenario() -> None:
        first = rig.controller()
        rig.omls.state = "window_open"
        await first.tick()
        assert await rig.engine.is_sleeping()
        # The Controller dies with its run; the window closes meanwhile. Its successor reads the state.
        rig.omls.state = "idle_wait"
        second = rig.controller()
        assert second.engine_slept is not None
        await second.tick()
        assert not await rig.engine.is_sleeping() and second.engine_slept is None
        assert [h["event"] for h in second.history][-2:] == ["run_lost", "engine_woken"]

    asyncio.run(scenario())


def test_a_controller_restarted_while_its_window_is_open_resumes_the_run_with_the_engine_asleep(rig):
    async def scenario() -> None:
        first = rig.controller()
        rig.omls.state = "window_open"
        await first.tick()
        rig.omls.state = "updating"
        second = rig.controller()
        await second.tick()  # resumes the window's run: the engine sleeps on, never woken in between
        assert rig.jobs.made[-1].running and await rig.engine.is_sleeping()
        assert rig.vllm.calls == [("sleep",)]
        rig.jobs.end()
        await second.tick()
        assert rig.vllm.calls == [("sleep",), ("wake_up",)]

    asyncio.run(scenario())


def test_a_run_that_cannot_start_after_the_sleep_wakes_the_engine_in_the_same_tick(rig):
    async def scenario() -> None:
        ctl = rig.controller()
        rig.jobs.fail_start = RuntimeError("no Replay actor")
        rig.omls.state = "window_open"
        await ctl.tick()
        assert not await rig.engine.is_sleeping() and rig.vllm.calls == [("sleep",), ("wake_up",)]
        assert ctl.history[-2]["event"] == "run_finished" and "no Replay actor" in ctl.history[-2]["error"]
        assert rig.omls.told == ["training_stopped"]

    asyncio.run(scenario())


def test_a_window_waiting_for_another_runs_lock_never_puts_the_engine_to_sleep(rig):
    from core.storage import StorageLayout
    from train.run_lock import acquire_run_lock

    async def scenario() -> None:
        ctl = rig.controller()
        lease = acquire_run_lock(StorageLayout(rig.root), "python -m train.job (run 'grpo')", heartbeat=False)
        try:
            rig.omls.state = "window_open"
            await ctl.tick()
            await ctl.tick()
        finally:
            lease.release()
        assert rig.vllm.calls == [] and rig.jobs.made[-1].running is False
        assert [h["event"] for h in ctl.history][-1] == "window_waiting"

    asyncio.run(scenario())


def test_a_wake_that_fails_is_asked_again_until_it_succeeds(rig):
    async def scenario() -> None:
        ctl = rig.controller()
        rig.omls.state = "window_open"
        await ctl.tick()
        rig.omls.state = "updating"
        rig.vllm.fail_wake = 2  # e.g. the trainer's GPU memory not released yet
        rig.jobs.end()
        await ctl.tick()  # the wake after the reap and the one at the tick's end both fail
        assert await rig.engine.is_sleeping() and ctl.engine_slept is not None
        assert ctl.store.get("controller")[1]["engine_slept"] is not None
        await ctl.tick()
        assert not await rig.engine.is_sleeping() and ctl.engine_slept is None

    asyncio.run(scenario())
