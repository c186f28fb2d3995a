"""`Controller`: turns OMLS windows into training runs (and back), in one of MetaClaw's three modes.

- `auto` (default): train only inside OMLS windows. A window → request the training resources from the
  autoscaler and start (or resume, same run name → same checkpoint) the GRPO job; the window closes →
  stop at the next step boundary (checkpoint written, samples committed), release the resource request.
- `rl`: train whenever the replay buffer holds `train.min_fresh_samples` fresh samples.
- `skills_only`: never train. In `rl` and `skills_only` an OMLS window is declined (OMLS is told the
  window's training ended), so it never waits on a run that will not come.

Level-triggered: on every tick (every `scheduler.poll_s`; a restarted Controller's first tick too) it does
the one thing that makes OMLS's state and its own run agree (cluster/reconcile.py, which says why).

One trainer at a time: every start takes the run lock (train/run_lock.py, through `TrainJob.start`;
the storage root's, or with `state.dsn` the state database's), shared with `python -m train.job` in
other processes and on other hosts. A start refused by it is
answered "a training run is already running since …"; a window then waits until that run has ended.

State (run counter, history of windows and runs, the current run) is persisted in the control store
(core/kv.py, key `controller`: `<storage root>/control/control.db`, or PostgreSQL with `state.dsn`, so
it outlives the node the Controller ran on). Every save is a compare-and-swap on the version this
incarnation last read or wrote: a stale incarnation fails loudly instead of overwriting its successor's
state. The `control/controller.json` file of older releases is adopted once. A restarted Controller
finds the run it was driving in `current`: that run died with the old process (Ray Train's controller
and workers are owned by it); a window run is resumed while its window is open, once `train.job` has
seen its Ray Train actors gone.

One GPU for the engine and the trainer (`engine.share_gpu_with_training: sleep`): every run the Controller
starts (window, `rl`, manual) puts the engine to sleep first and wakes it once the run's thread has ended
and its Ray Train workers are gone; the wake is level-triggered (cluster/gpu_share.py), persisted
(`engine_slept`) and so also done by a restarted Controller.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import ray

from cluster import gpu_share
from cluster.controller_state import LEGACY_FILE, STATE_KEY
from cluster.reconcile import ACK_STARTED, ACK_STOPPED, START, STOP, reconcile
from cluster.trainer_preload import preload_trainer
from core import names
from core.config import ClawrayConfig
from core.kv import Conflict, adopt_json, control_store
from core.storage import StorageLayout

log = logging.getLogger("clawray.controller")
HISTORY_MAX = 500
SERVING_PROBE_S = 10.0  # how long the engine may take to answer the start-up probe
ENGINE_SLEEP_S = 300.0  # how long the engine may take to sleep (in-flight requests finish first) or wake
RUN_NAME = "grpo"  # the Ray Train run of every Controller run: the same name resumes its checkpoint
WORKERS_GONE_S = 60.0  # how long a wake waits for an ended run's Ray Train workers to be gone
# Runs that re-sample GRPO groups first (`train.rollouts`): a window's (serving idle by definition) and a
# manual one (the operator's call); an `rl` run trains while users work, so it takes what they were served.
ROLLOUT_RUNS = ("window", "manual")


def training_bundles(cfg: ClawrayConfig) -> list[dict[str, float]]:
    """One resource bundle per (max) training worker: what the autoscaler is asked for, exactly what each
    Ray Train worker asks for (`train.worker_bundle`), so the nodes it adds can take the workers."""
    return [cfg.train.worker_bundle() for _ in range(cfg.train.max_workers())]


class ControllerActor:
    def __init__(self, cfg: dict[str, Any], poll_s: float | None = None, serving_app: str | None = None):
        from train.run_lock import run_lock_for

        self.cfg = ClawrayConfig.model_validate(cfg)
        self.layout = StorageLayout(self.cfg.storage_path(), blob_root=self.cfg.blob_root()).ensure()
        self.store = control_store(self.layout.root, self.cfg.state)
        self.run_lock = run_lock_for(self.layout, self.cfg.state)  # read for `status`; runs take their own
        self.poll_s = poll_s or self.cfg.scheduler.poll_s
        # The Serve app whose engine must be up before a run starts (`serve run` brings the actors up
        # before the app: a window must not open training while vLLM is still starting); None = no gate.
        self.serving_app = serving_app
        self._serving_seen = False  # the engine answered once (latched)
        self._serving_down_seen = False  # ... and did not answer before that, as seen by this incarnation
        got = adopt_json(self.store, STATE_KEY, self.layout.control / LEGACY_FILE)
        self._version, saved = got or (0, {})  # the version this incarnation last read or wrote
        self.runs: int = saved.get("runs", 0)
        self.history: list[dict[str, Any]] = saved.get("history", [])
        self.job = None
        self.current: dict[str, Any] | None = None
        # Tests only (`set_test_hooks`): actors the runs of this incarnation await at step boundaries.
        self.test_hooks: dict[str, str] = {}
        # One GPU shared with the engine (cluster/gpu_share.py): `engine_slept` is saved before the engine
        # is asked to sleep and cleared once it answered a wake, so a restarted Controller still wakes it.
        self.sharing = self.cfg.engine.share_gpu_with_training == "sleep"
        self.engine_slept: dict[str, Any] | None = saved.get("engine_slept")
        self._wake_blocked_since: float | None = None  # when a due wake first found training workers alive
        # We died while a run went on (it died with us: Ray Train's controller and workers are owned by
        # this process). A window run is resumed while its window is open; a resume frees its leases.
        lost = saved.get("current")
        self._resume = bool(lost and lost.get("reason") == "window")
        if lost:
            self._event("run_lost", run=lost.get("run"), reason=lost.get("reason"))
        self._save()
        self._waiting: str | None = None  # the last "already running" answer a window got (logged once)
        # Starts, reaps and reconciles one at a time: the control loop and API calls share the actor.
        self._serial = asyncio.Lock()
        self._loop: asyncio.Task | None = None
        # Ray runs an async actor's constructor on the actor's event loop: start the control loop here,
        # so a Controller restarted after a crash (max_restarts) ticks again without anyone calling
        # `ready()`. Outside a loop (plain construction in tests) `ready()` starts it.
        try:
            self._loop = asyncio.get_running_loop().create_task(self._run())
        except RuntimeError:
            pass
        if self.cfg.scheduler.mode != "skills_only":
            threading.Thread(target=preload_trainer, args=(RUN_NAME, self.cfg.ray.namespace),
                             name="preload-trainer", daemon=True).start()

    # ---- persistence ------------------------------------------------------------------------------

    def _save(self) -> None:
        doc = {"runs": self.runs, "history": self.history[-HISTORY_MAX:], "current": self.current,
               "engine_slept": self.engine_slept}
        try:
            self._version = self.store.put(STATE_KEY, doc, self._version)
        except Conflict:
            log.error("a newer Controller incarnation owns the state; this one is stale and saves nothing")
            raise

    def _event(self, kind: str, **data: Any) -> None:
        self.history.append({"event": kind, "at": time.time(), **data})
        self._save()

    # ---- wiring to other actors (by name) ---------------------------------------------------------

    def _actor(self, name: str):
        try:  # cached (core/names.py); one try: an absent actor is asked for again next tick
            return names.actor(name, self.cfg.ray.namespace, timeout_s=0)
        except ValueError:
            return None

    async def _omls(self, method: str, *args: Any) -> Any:
        omls = self._actor(names.OMLS)
        if omls is None:
            return None
        with names.forget_if_dead(names.OMLS, self.cfg.ray.namespace):
            return await getattr(omls, method).remote(*args)

    # ---- job lifecycle ----------------------------------------------------------------------------

    def _request_resources(self, on: bool) -> None:
        from ray.autoscaler.sdk import request_resources

        try:
            request_resources(bundles=training_bundles(self.cfg) if on else [])
        except Exception as e:  # noqa: BLE001 - no autoscaler (plain local cluster): nothing to scale
            log.info("resource request not applied (%s)", e)

    def _running(self) -> str | None:
        """The reason of the run going now, or None. The truth is the run's thread, not saved state."""
        if self.job is not None and self.job.running and self.current is not None:
            return self.current["reason"]
        return None

    async def _start(self, reason: str, max_steps: int | None = None) -> None:
        """Start a run. Raises `RunLockBusy` while any run holds the run lock; any other failure to
        start is recorded as a failed run, then raised."""
        from train.job import TrainJob
        from train.run_lock import RunLockBusy, busy_message

        await self._reap()  # a run that has just ended is recorded before `current` is replaced
        if self._running():  # ours: answered without touching the lock
            raise RunLockBusy(busy_message(self.current["started_at"],
                                           f"Controller {self.current['reason']} run {self.current['run']}"))
        job = TrainJob(self.cfg.train, model_path=self.cfg.model_path(), storage=self.layout,
                       run_name=RUN_NAME, max_steps=max_steps, lease_s=self.cfg.replay.lease_timeout_s,
                       holder=f"Controller {reason} run {self.runs + 1}", state=self.cfg.state,
                       namespace=self.cfg.ray.namespace, test_hooks=self.test_hooks or None)
        rollouts = self.cfg.train.rollouts.enabled and reason in ROLLOUT_RUNS
        if self.sharing or rollouts:  # a run we would wait for must not cost serving a sleep, nor re-sampling
            await asyncio.to_thread(self._raise_if_locked)
        groups = await self._rollouts(reason) if rollouts else None  # the engine is awake and idle now
        try:
            await self._sleep_engine(reason)
            await asyncio.to_thread(job.start)
        except RunLockBusy:
            await self._sync_engine()
            raise
        except Exception as e:
            self.runs += 1
            self._event("run_finished", run=self.runs, reason=reason, steps=0, stop_reason="error",
                        error=f"could not start: {type(e).__name__}: {e}")
            await self._sync_engine()
            raise
        self._request_resources(True)
        self.runs += 1
        self.job = job
        self.current = {"run": self.runs, "reason": reason, "started_at": time.time(), "rollouts": groups}
        self._event("run_started", run=self.runs, reason=reason)

    async def _rollouts(self, reason: str) -> dict[str, Any] | None:
        """Re-sampled GRPO groups for the run about to start (train/rollouts.py), recorded as an event and
        returned (its summary). A failure here never stops the run: it trains what the buffer holds."""
        from ray import serve

        from cluster.rollouts import resample_groups

        replay, prms = self._actor(names.REPLAY), names.names_for(self.cfg).prms
        if replay is None or not prms:
            return None
        try:
            engine = serve.get_deployment_handle(names.ENGINE, app_name=self.serving_app or names.APP)
            report = await resample_groups(self.cfg, replay=replay, engine=engine, prm=self._actor, prms=prms)
        except Exception as e:  # noqa: BLE001 - e.g. Replay unreachable: the run goes ahead without groups
            log.warning("re-sampling for the %s run failed: %s: %s", reason, type(e).__name__, e)
            self._event("rollouts_failed", reason=reason, error=f"{type(e).__name__}: {str(e)[:200]}")
            return None
        summary = report.as_dict()
        rewards = summary.pop("rewards")
        summary["mean_reward"] = round(sum(map(sum, rewards)) / report.samples, 4) if report.samples else None
        self._event("rollouts", reason=reason, **summary)
        return summary

    async def _stop(self) -> None:
        if self.job is not None and self.job.running:
            await asyncio.to_thread(self.job.request_stop)

    async def _reap(self) -> None:
        """A run that ended (stopped, out of samples, out of budget, failed): record it. OMLS hears of it
        from `reconcile`, on this tick or a later one."""
        if self.job is None or self.job.running or self.current is None:
            return
        result = await asyncio.to_thread(self.job.wait, 0)
        run, reason = self.current["run"], self.current["reason"]
        data = {"run": run, "reason": reason, "rollouts": self.current.get("rollouts")}
        self.current = None
        self._request_resources(False)
        if result is None:  # its thread died without a result
            data.update(steps=0, stop_reason="error", error="the training run's thread ended without a result")
        else:
            data.update(steps=len(result.steps), stop_reason=result.stop_reason, error=result.error,
                        adapters=result.adapters, trained=len(result.trained_sample_ids))
        self._event("run_finished", **data)
        await self._sync_engine()  # the run's workers are gone: the engine takes its GPU back

    # ---- one GPU shared with the engine (cluster/gpu_share.py) ---------------------------------------

    def _raise_if_locked(self) -> None:
        from train.run_lock import RunLockBusy, busy_message

        held = self.run_lock.current()
        if held is not None and not self.run_lock.is_stale(held):
            raise RunLockBusy(busy_message(held.since, held.describe()), held)

    @staticmethod
    def _train_workers_alive() -> bool:
        """Whether Ray Train workers of this process's runs are still alive: a run's thread ends when
        `fit()` returns, and Ray kills its workers (and so frees their GPU memory) just after."""
        if not ray.is_initialized():
            return False
        from ray._private.state import actors  # Ray's GCS accessor (train/job.py reads it the same way)

        job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
        return any(a["ActorClassName"] == "RayTrainWorker" and a["State"] != "DEAD"
                   for a in actors(job_id=job).values())

    async def _engine_call(self, method: str) -> Any:
        from ray import serve

        handle = serve.get_deployment_handle(names.ENGINE, app_name=self.serving_app or names.APP)
        return await asyncio.wait_for(getattr(handle, method).remote(), ENGINE_SLEEP_S)

    async def _sleep_engine(self, reason: str) -> None:
        """Before a run on the shared GPU: the engine sleeps (saved first: whatever happens next, a later
        tick wakes it). Raises when the engine did not sleep: the run must not start beside it."""
        if gpu_share.engine_action(self.sharing, self.engine_slept is not None, False, True) != gpu_share.SLEEP:
            return
        self.engine_slept = {"at": time.time(), "reason": reason}
        self._save()
        t0 = time.monotonic()
        await self._engine_call("sleep")
        self._event("engine_slept", reason=reason, seconds=round(time.monotonic() - t0, 2))

    async def _sync_engine(self) -> None:
        """Wake the engine when we put it to sleep and no run of ours trains (the run ended, failed, was
        stopped, could not start, or died with a previous Controller). A failed wake is logged and asked
        again on the next tick."""
        running = self.job is not None and self.job.running
        if gpu_share.engine_action(self.sharing, self.engine_slept is not None, running, False) != gpu_share.WAKE:
            return
        t0 = time.monotonic()
        if await asyncio.to_thread(self._train_workers_alive):  # their GPU memory is not free yet
            self._wake_blocked_since = self._wake_blocked_since or t0
            if t0 - self._wake_blocked_since < WORKERS_GONE_S:
                return  # next tick
            log.warning("Ray Train workers still alive %.0f s after their run: waking the engine anyway",
                        t0 - self._wake_blocked_since)
        try:
            await self._engine_call("wake_up")
        except Exception as e:  # noqa: BLE001 - no app, a replica restarting, GPU memory not free yet: next tick
            log.warning("the engine did not wake (asked again next tick): %s: %s", type(e).__name__, e)
            return
        self.engine_slept, self._wake_blocked_since = None, None
        self._event("engine_woken", seconds=round(time.monotonic() - t0, 2))

    async def _fresh(self) -> int:
        replay = self._actor(names.REPLAY)
        if replay is None:
            return 0
        with names.forget_if_dead(names.REPLAY, self.cfg.ray.namespace):
            stats = await replay.stats.remote()
        return int(stats.get("trainable", 0))  # fresh samples of the current skill generation

    # ---- reconciling with OMLS --------------------------------------------------------------------

    async def _probe_serving(self) -> bool:
        """Whether the engine answers (vLLM has started): a `models` call through the engine deployment's
        handle. (Not `serve.status()`: under load an app that serves requests can report a status other
        than RUNNING for minutes, which held a demo's window until the users came back.)"""
        from ray import serve

        try:
            handle = serve.get_deployment_handle(names.ENGINE, app_name=self.serving_app)
            await asyncio.wait_for(handle.models.remote(), timeout=SERVING_PROBE_S)
        except Exception as e:  # noqa: BLE001 - no app, no replica yet, or still starting: asked next tick
            log.debug("serving not ready: %s: %s", type(e).__name__, e)
            return False
        return True

    async def _watch_serving(self) -> None:
        """Until the engine has answered once, probe it every tick (latched: the gate only guards the
        start-up). When it first answers after this Controller saw it down, users can arrive from now on:
        the inactivity clock starts now (activity reported to OMLS, which re-evaluates at once), so a
        window that inactivity opened while vLLM was starting closes untrained instead of starting a run
        under the first users. A Controller that finds serving already up (restarted beside a running app)
        reports nothing: an open window there is a real absence."""
        if self.serving_app is None or self._serving_seen:
            return
        if not await self._probe_serving():
            self._serving_down_seen = True
            return
        if self._serving_down_seen:  # told before latching: an OMLS call that fails is made again next tick
            await self._omls("report_activity", time.time())
            await self._omls("tick")
            self._event("serving_up")
        self._serving_seen = True

    async def _wait_for_serving(self) -> bool:
        """True when a run may start; else records (once) that the window waits for serving."""
        if self.serving_app is None or self._serving_seen:
            return True
        reason = f"serving ({self.serving_app}) is not running yet"
        if reason != self._waiting:
            self._waiting = reason
            self._event("window_waiting", reason=reason)
        return False

    async def _start_window(self) -> None:
        from train.run_lock import RunLockBusy

        if not await self._wait_for_serving():
            return
        try:
            await self._start("window")
        except RunLockBusy as e:  # another run trains (a CLI run, a manual step): the window waits for it
            if str(e) != self._waiting:
                self._waiting = str(e)
                self._event("window_waiting", reason=str(e))
            return
        except Exception:  # noqa: BLE001 - recorded by _start; the window is used up by its failed run
            log.exception("the window's training run could not start")
            self._resume = False
            await self._omls("training_stopped")
            return
        self._waiting, self._resume = None, False
        await self._omls("training_started")

    async def _reconcile(self) -> None:
        st = await self._omls("state")
        if st is None:
            return  # no OMLS (yet): next tick
        action = reconcile(self.cfg.scheduler.mode, st.get("state"), self._running(), self._resume)
        if action != START:
            self._resume = False  # the lost run's window is gone (or a run is going): nothing to resume
        if action is not None:
            log.info("OMLS %s, run %s: %s", st.get("state"), self._running(), action)
        if action == START:
            await self._start_window()
        elif action == ACK_STARTED:
            await self._omls("training_started")
        elif action == ACK_STOPPED:
            await self._omls("training_stopped")
        elif action == STOP:
            await self._stop()
            self._request_resources(False)

    async def tick(self) -> None:
        async with self._serial:
            await self._watch_serving()
            await self._reap()
            for a in await self._omls("pending_actions") or []:  # hints: the state is what we act on
                self._event("window_" + (a.get("action") or "transition"), state=a.get("dst"),
                            reason=a.get("reason"))
            await self._reconcile()
            if self.cfg.scheduler.mode == "rl" and self._running() is None:
                if await self._fresh() >= self.cfg.train.min_fresh_samples:
                    await self._start_rl()
            await self._sync_engine()  # a wake a previous tick (or Controller) could not finish

    async def _start_rl(self) -> None:
        from train.run_lock import RunLockBusy

        if not await self._wait_for_serving():
            return
        try:
            await self._start("rl")
        except RunLockBusy as e:
            log.info("rl run not started: %s", e)
        except Exception:  # noqa: BLE001 - recorded by _start; tried again on the next tick
            log.exception("rl training run could not start")

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
        """Run `steps` training steps now (manual), outside any window; returns the run's
        `run_finished` event, or {"error": "a training run is already running since …"}."""
        from train.run_lock import RunLockBusy

        async with self._serial:
            try:
                await self._start("manual", max_steps=steps)
            except RunLockBusy as e:
                return {"error": str(e)}
            except Exception:  # noqa: BLE001 - recorded by _start as a failed run: answered below
                return self.history[-1]
            job, run = self.job, self.current["run"]
        await asyncio.to_thread(job.wait)
        async with self._serial:
            await self._reap()  # unless a tick reaped it first
        return next(h for h in reversed(self.history) if h["event"] == "run_finished" and h.get("run") == run)

    async def set_test_hooks(self, hooks: dict[str, str] | None) -> None:
        """Tests only: the `test_hooks` (train/grpo.py, e.g. {"before_seal": actor name}) of the runs this
        incarnation starts from now on, so a test holds a window's step at its seal instead of racing it.
        Not saved: a restarted Controller starts runs without them."""
        self.test_hooks = dict(hooks or {})

    async def stop_training(self) -> dict[str, Any]:
        await self._stop()
        return await self.status()

    async def status(self) -> dict[str, Any]:
        job = await asyncio.to_thread(self.job.status) if self.job is not None else None
        lock = await asyncio.to_thread(self.run_lock.current)
        return {
            "mode": self.cfg.scheduler.mode,
            "running": self._running() is not None,
            "current": self.current,
            "runs": self.runs,
            "loop": self._loop is not None and not self._loop.done(),
            "job": job,
            "run_lock": lock.to_dict() if lock is not None else None,
            "engine_asleep": self.engine_slept,  # put to sleep by us for a run on the shared GPU, or None
            "last_run": next((h for h in reversed(self.history) if h["event"] == "run_finished"), None),
        }

    async def history_events(self) -> list[dict[str, Any]]:
        return list(self.history)


def start_controller(cfg: ClawrayConfig, *, detached: bool = False, poll_s: float | None = None,
                     serving_app: str | None = None):
    """The `Controller` (created, or the running one); `serving_app`: gate runs on that Serve app running."""
    names.forget(names.CONTROLLER, cfg.ray.namespace)  # this process may hold a killed incarnation's handle
    handle = ray.remote(ControllerActor).options(
        name=names.CONTROLLER, namespace=cfg.ray.namespace, get_if_exists=True, max_restarts=-1,
        lifetime="detached" if detached else None, num_cpus=0, max_concurrency=16,
    ).remote(cfg.model_dump(mode="json"), poll_s, serving_app)
    ray.get(handle.ready.remote())
    return handle
