"""`Controller`: turns OMLS windows into training runs (and back), in one of MetaClaw's three modes.

- `auto` (default): train only inside OMLS windows. `start_training` → request the training resources
  from the autoscaler and start (or resume, same run name → same checkpoint) the GRPO job;
  `stop_training` → stop at the next step boundary (checkpoint written, samples committed), release the
  resource request, tell OMLS. A job that ends by itself (no fresh samples, step budget) is reported too.
- `rl`: train whenever the replay buffer holds `train.min_fresh_samples` fresh samples.
- `skills_only`: never train.

State (run counter, history of windows and runs) is persisted under `control/controller.json`, so a
restarted Controller re-reads it; a job can only be started when none is running (never double-started).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import ray

from core.config import ClawrayConfig
from core.storage import StorageLayout, atomic_write_json, read_json

log = logging.getLogger("clawray.controller")
NAME = "Controller"
NAMESPACE = "clawray"
HISTORY_MAX = 500


def training_bundles(cfg: ClawrayConfig) -> list[dict[str, float]]:
    """One resource bundle per (max) training worker: what the autoscaler is asked for."""
    workers = cfg.train.num_workers
    n = workers if isinstance(workers, int) else workers[1]
    bundle: dict[str, float] = {"CPU": cfg.train.cpus_per_worker}
    if cfg.train.use_gpu:
        bundle.update({"GPU": 1.0, "clawray_train": 1.0})
    return [dict(bundle) for _ in range(n)]


class ControllerActor:
    def __init__(self, cfg: dict[str, Any], poll_s: float | None = None):
        self.cfg = ClawrayConfig.model_validate(cfg)
        self.layout = StorageLayout(self.cfg.storage_path()).ensure()
        self.path = self.layout.control / "controller.json"
        self.poll_s = poll_s or self.cfg.scheduler.poll_s
        saved = read_json(self.path, {}) or {}
        self.runs: int = saved.get("runs", 0)
        self.history: list[dict[str, Any]] = saved.get("history", [])
        self.job = None
        self.current: dict[str, Any] | None = None
        # We died while a job ran (it died with us: Ray Train's controller and workers are owned by this
        # process). `tick` resumes it if its window is still open; its leases are freed by that resume.
        self._lost: dict[str, Any] | None = saved.get("current")
        if self._lost:
            self._event("run_lost", run=self._lost.get("run"))
        self._save()
        self._loop: asyncio.Task | None = None
        # Ray runs an async actor's constructor on the actor's event loop: start the control loop here,
        # so a Controller restarted after a crash (max_restarts) ticks again without anyone calling
        # `ready()`. Outside a loop (plain construction in tests) `ready()` starts it.
        try:
            self._loop = asyncio.get_running_loop().create_task(self._run())
        except RuntimeError:
            pass

    # ---- persistence ------------------------------------------------------------------------------

    def _save(self) -> None:
        atomic_write_json(self.path, {"runs": self.runs, "history": self.history[-HISTORY_MAX:],
                                      "current": self.current})

    def _event(self, kind: str, **data: Any) -> None:
        self.history.append({"event": kind, "at": time.time(), **data})
        self._save()

    # ---- wiring to other actors (by name) ---------------------------------------------------------

    @staticmethod
    def _actor(name: str):
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None

    async def _omls(self, method: str) -> Any:
        omls = self._actor("OMLS")
        return None if omls is None else await getattr(omls, method).remote()

    # ---- job lifecycle ----------------------------------------------------------------------------

    def _request_resources(self, on: bool) -> None:
        from ray.autoscaler.sdk import request_resources

        try:
            request_resources(bundles=training_bundles(self.cfg) if on else [])
        except Exception as e:  # noqa: BLE001 - no autoscaler (plain local cluster): nothing to scale
            log.info("resource request not applied (%s)", e)

    async def _start(self, reason: str, max_steps: int | None = None) -> bool:
        if self.job is not None and self.job.running:
            return False  # never double-start
        from train.job import TrainJob

        self._request_resources(True)
        self.runs += 1
        self.job = TrainJob(self.cfg.train, model_path=self.cfg.model_path(), storage=self.layout,
                            run_name="grpo", max_steps=max_steps,
                            lease_s=self.cfg.replay.lease_timeout_s)
        await asyncio.to_thread(self.job.start)
        self.current = {"run": self.runs, "reason": reason, "started_at": time.time()}
        self._event("run_started", run=self.runs, reason=reason)
        if reason == "window":
            await self._omls("training_started")
        return True

    async def _stop(self) -> None:
        if self.job is not None and self.job.running:
            await asyncio.to_thread(self.job.request_stop)

    async def _reap(self) -> None:
        """A job that finished (stopped, out of samples, out of budget, failed): record and report."""
        if self.job is None or self.job.running or self.current is None:
            return
        result = await asyncio.to_thread(self.job.wait, 0)
        run, reason = self.current["run"], self.current["reason"]
        self.current = None
        self._request_resources(False)
        data = {"run": run}
        if result is not None:
            data.update(steps=len(result.steps), stop_reason=result.stop_reason, error=result.error,
                        adapters=result.adapters, trained=len(result.trained_sample_ids))
        self._event("run_finished", **data)
        if reason == "window":
            await self._omls("training_stopped")

    async def _fresh(self) -> int:
        replay = self._actor("Replay")
        if replay is None:
            return 0
        stats = await replay.stats.remote()
        return int(stats.get("trainable", 0))  # fresh samples of the current skill generation

    async def _recover(self) -> None:
        """Once after a restart: a window run we lost is resumed while OMLS still holds the window open;
        a window that closed meanwhile is acknowledged, so OMLS does not wait in PAUSING forever."""
        st = await self._omls("state")
        if st is None:
            return  # no OMLS (yet): try again next tick
        if self._lost.get("reason") == "window" and self.cfg.scheduler.mode == "auto":
            if st.get("state") in ("window_open", "updating"):
                await self._start("window")  # the same run name resumes from its last checkpoint
            elif st.get("state") == "pausing":
                await self._omls("training_stopped")
        self._lost = None  # only now: a failed resume (raised above) is tried again next tick

    async def tick(self) -> None:
        if self._lost is not None:
            await self._recover()
        await self._reap()
        mode = self.cfg.scheduler.mode
        actions = await self._omls("pending_actions") or []
        for a in actions:
            kind = a.get("action")
            self._event("window_" + (kind or "transition"), state=a.get("dst"), reason=a.get("reason"))
            if mode != "auto":
                continue
            if kind == "start_training":
                if not await self._start("window"):
                    await self._omls("training_started")  # already running: keep OMLS in sync
            elif kind in ("stop_training", "cancel_training"):
                await self._stop()
                self._request_resources(False)
        if mode == "rl" and (self.job is None or not self.job.running):
            if await self._fresh() >= self.cfg.train.min_fresh_samples:
                await self._start("rl")

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the control loop must survive a failed tick
                log.exception("controller tick failed")
            await asyncio.sleep(self.poll_s)

    # ---- API --------------------------------------------------------------------------------------

    async def ready(self) -> bool:
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._run())
        return True

    async def train_step(self, steps: int = 1) -> dict[str, Any]:
        """Run `steps` training steps now (manual), outside any window; returns the run's result."""
        if not await self._start("manual", max_steps=steps):
            return {"error": "a training run is already in progress"}
        await asyncio.to_thread(self.job.wait)
        await self._reap()
        return self.history[-1]

    async def stop_training(self) -> dict[str, Any]:
        await self._stop()
        return await self.status()

    async def status(self) -> dict[str, Any]:
        job = await asyncio.to_thread(self.job.status) if self.job is not None else None
        return {
            "mode": self.cfg.scheduler.mode,
            "running": bool(self.job is not None and self.job.running),
            "current": self.current,
            "runs": self.runs,
            "loop": self._loop is not None and not self._loop.done(),
            "job": job,
            "last_run": next((h for h in reversed(self.history) if h["event"] == "run_finished"), None),
        }

    async def history_events(self) -> list[dict[str, Any]]:
        return list(self.history)


def start_controller(cfg: ClawrayConfig, *, detached: bool = False, poll_s: float | None = None):
    handle = ray.remote(ControllerActor).options(
        name=NAME, namespace=NAMESPACE, get_if_exists=True, max_restarts=-1,
        lifetime="detached" if detached else None, num_cpus=0, max_concurrency=16,
    ).remote(cfg.model_dump(mode="json"), poll_s)
    ray.get(handle.ready.remote())
    return handle


def controller_state_path(storage_root: Path) -> Path:
    return StorageLayout(storage_root).control / "controller.json"
