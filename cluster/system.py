"""The composition root: wires every plane into one running system from the validated config.

Order matters only for readiness: the sinks exist before their producers (Replay ← PRM ← Proxy outbox;
Evolver, Memory ← PRM), the control plane last (once serving is healthy). Every actor has its DESIGN.md name in namespace `clawray`.
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


def start_system(cfg: ClawrayConfig, *, detached: bool = False, serve_app: bool = True,
                 progress=None) -> System:
    """Start (or join) Ray and bring up Replay, Evolver, Memory, PRM pool, the Serve app, OMLS and Controller."""
    from cluster.controller import start_controller
    from cluster.omls_actor import start_omls
    from cluster.runtime import deploy_serving, start_ray
    from evolve.actor import get_or_create_evolver
    from rewards.pool import prm_name, start_prm_pool
    from rewards.sinks import ReplayActorSink
    from train.replay import get_or_create_replay

    def step(msg: str) -> None:
        if progress is not None:
            progress(msg)
        log.info(msg)

    layout = StorageLayout(cfg.storage_path()).ensure()
    step("starting Ray")
    start_ray(cfg)
    handles: dict[str, Any] = {}
    step("Replay actor (replay buffer)")
    handles["Replay"] = get_or_create_replay(cfg.replay, layout, detached=detached, state=cfg.state.model_dump())
    ray.get(handles["Replay"].stats.remote())
    step("Evolver actor (skill library)")
    handles["Evolver"] = get_or_create_evolver(layout.skills, cfg.skills, cfg.evolver, detached=detached)
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
    base_url = ""
    if serve_app:
        step("Serve app: Proxy -> PolicyEngine (vLLM)")
        base_url = deploy_serving(cfg, sink_actors=[prm_name(i) for i in range(len(prms))])
    # The control plane last: an inactivity window must not open while vLLM is still starting.
    step("OMLS scheduler")
    handles["OMLS"] = start_omls(cfg.scheduler, layout.root, detached=detached, state=cfg.state.model_dump())
    step(f"Controller (mode {cfg.scheduler.mode})")
    handles["Controller"] = start_controller(cfg, detached=detached)
    return System(cfg, base_url, handles)


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
