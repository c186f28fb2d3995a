"""The composition root: wires every plane into one running system from the validated config.

One path for every way of starting it: the Serve app's builder (`cluster.serve_app:build`, what `serve
run configs/serve.yaml` and `serve deploy` import) calls `ensure_actors` and then binds the app;
`clawray start` (`start_system`) starts Ray and deploys that same app. Order matters only for readiness:
the sinks exist before their producers (Replay ← PRM ← Proxy outbox; Evolver, Memory ← PRM); the
Controller gates its runs on the Serve app running. Every actor has its DESIGN.md name.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import ray

from core.config import ClawrayConfig
from core.storage import StorageLayout

log = logging.getLogger("clawray.system")
MEMORY_NAME = "Memory"
ACTOR_NAMES = ("Replay", "Evolver", MEMORY_NAME, "OMLS", "Controller")


@dataclass
class System:
    cfg: ClawrayConfig
    base_url: str
    handles: dict[str, Any]


def start_system(cfg: ClawrayConfig, *, detached: bool = False, progress=None) -> System:
    """Start (or join) Ray, then deploy the whole system exactly as `serve run configs/serve.yaml` does:
    the app's builder (`build_system_app`) brings up or attaches to the actors, then the Serve app."""
    from cluster.runtime import deploy_serving, start_ray

    def step(msg: str) -> None:
        if progress is not None:
            progress(msg)
        log.info(msg)

    step("starting Ray")
    start_ray(cfg)
    handles = ensure_actors(cfg, detached=detached, progress=step)
    step("Serve app: Proxy -> PolicyEngine (vLLM)")
    base_url = deploy_serving(cfg, sink_actors=sink_names(cfg))
    return System(cfg, base_url, handles)


def sink_names(cfg: ClawrayConfig) -> list[str]:
    """The named actors the Proxy's outbox delivers finished turns to (the PRM pool)."""
    from rewards.pool import prm_name

    return [prm_name(i) for i in range(cfg.rewards.pool_size)]


def ensure_actors(cfg: ClawrayConfig, *, detached: bool = True, progress=None) -> dict[str, Any]:
    """Bring up, or attach to, every named actor of the system: Replay, Evolver, Memory, the PRM pool, OMLS
    and the Controller (namespace `ray.namespace`). Idempotent: each is created only if it does not exist
    (`get_if_exists`), so a second call (a redeploy, `serve deploy` after `clawray start`) attaches and
    never duplicates. Called by the Serve app's builder (`serve run` / `serve deploy`, where they must be
    detached: the build runs in a task that ends) and by `start_system`. The Controller starts no run
    before the Serve app is RUNNING (an idle window must not start training while vLLM is starting)."""
    from cluster.controller import start_controller
    from cluster.omls_actor import start_omls
    from cluster.serve_app import APP_NAME
    from evolve.actor import get_or_create_evolver
    from rewards.pool import prm_name, start_prm_pool
    from rewards.sinks import ReplayActorSink
    from train.replay import get_or_create_replay

    def step(msg: str) -> None:
        if progress is not None:
            progress(msg)
        log.info(msg)

    layout = StorageLayout(cfg.storage_path()).ensure()
    handles: dict[str, Any] = {}
    step("Replay actor (replay buffer)")
    handles["Replay"] = get_or_create_replay(cfg.replay, layout, detached=detached, state=cfg.state.model_dump())
    ray.get(handles["Replay"].stats.remote())
    step("Evolver actor (skill library)")
    handles["Evolver"] = get_or_create_evolver(layout.skills, cfg.skills, cfg.evolver, detached=detached,
                                               blob_root=cfg.blob_root())
    # The replay buffer follows the skill library's generation from the start (support/query split).
    # Generations never go back: a skills folder wiped or replaced since Replay last saw generation g is
    # written up to a new generation above g (its S changed), never left below (Replay would retire
    # every new sample served under the lower one).
    replay_gen = ray.get(handles["Replay"].stats.remote())["generation"]
    generation = ray.get(handles["Evolver"].reconcile_generation.remote(replay_gen))
    ray.get(handles["Replay"].set_generation.remote(generation))
    if cfg.memory.enabled:  # before the PRMs, which tell it about every scored turn
        step("Memory actor (long-term memory)")
        handles[MEMORY_NAME] = start_memory(cfg, layout, detached=detached)
    step(f"PRM pool ({cfg.rewards.pool_size} actor(s))")
    workspaces = cfg.rewards.workspace_root or str(layout.root / "workspaces")
    prms = start_prm_pool(cfg.rewards, functools.partial(ReplayActorSink), detached=detached,
                          tokenizer_path=cfg.model_path(), workspace_root=workspaces,
                          judge_max_tokens=cfg.rewards.judge_max_tokens, engine_judge=engine_judge(cfg),
                          observer_names=(MEMORY_NAME,) if cfg.memory.enabled else ())
    handles.update({prm_name(i): h for i, h in enumerate(prms)})
    step("OMLS scheduler")
    handles["OMLS"] = start_omls(cfg.scheduler, layout.root, detached=detached, state=cfg.state.model_dump())
    step(f"Controller (mode {cfg.scheduler.mode})")
    handles["Controller"] = start_controller(cfg, detached=detached, serving_app=APP_NAME)
    return handles


def engine_judge(cfg: ClawrayConfig) -> dict[str, str] | None:
    """Where PRM judge votes go when the served base model judges (`rewards.judge_source` resolves to
    `engine`): the engine deployment of the app, by name, and the base model's served name."""
    if cfg.rewards.resolved_judge_source() != "engine":
        return None
    from cluster.serve_app import APP_NAME, ENGINE_DEPLOYMENT

    return {"deployment": ENGINE_DEPLOYMENT, "app": APP_NAME, "model": cfg.model.served_name}


def start_memory(cfg: ClawrayConfig, layout: StorageLayout, *, detached: bool = False):
    """The `Memory` actor (memory/actor.py), ready; it gets the skills plane's offline MiniLM loader as its
    embedder factory (memory/ imports no other plane)."""
    from evolve.embedding import SentenceEmbedder
    from memory.actor import get_or_create_memory

    model = cfg.memory.embedding_model
    factory = functools.partial(SentenceEmbedder, model) if model else None
    handle = get_or_create_memory(str(layout.memory), cfg.memory, factory, name=MEMORY_NAME,
                                  namespace=cfg.ray.namespace, detached=detached, state=cfg.state.model_dump())
    ray.get(handle.ready.remote())
    return handle


def stop_system(cfg: ClawrayConfig | None = None) -> None:
    """Delete the Serve app and the named actors (detached ones too), then leave Ray."""
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        serve.shutdown()
    except Exception as e:  # noqa: BLE001 - nothing to shut down is fine
        log.info("serve shutdown: %s", e)
    names = list(ACTOR_NAMES) + [f"PRM-{i}" for i in range(cfg.rewards.pool_size if cfg else 8)]
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace="clawray"), no_restart=True)
        except ValueError:
            pass
    time.sleep(0.5)
    ray.shutdown()
