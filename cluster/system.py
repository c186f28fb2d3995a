"""The composition root: wires every plane into one running system from the validated config.

One path for every way of starting it: the Serve app's builder (`cluster.serve_app:build`, what `serve
run configs/serve.yaml` and `serve deploy` import) calls `ensure_actors` and then binds the app;
`clawray start` (`start_system`) starts Ray and deploys that same app. Order matters only for readiness:
the sinks exist before their producers (Replay ← PRM ← Proxy outbox; Evolver, Memory ← PRM); the
Controller gates its runs on the Serve app running. Every actor has its DESIGN.md name (core/names.py)
in the configured namespace (`ray.namespace`), which this module hands to every actor it starts: each
finds the others there by name.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import ray

from core import names
from core.agent_context import context_markers
from core.config import ClawrayConfig
from core.names import Names, names_for
from core.storage import StorageLayout

log = logging.getLogger("clawray.system")


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
    return names_for(cfg).prms


def ensure_actors(cfg: ClawrayConfig, *, detached: bool = True, progress=None) -> dict[str, Any]:
    """Bring up, or attach to, every named actor of the system: Replay, Evolver, Memory, the PRM pool, OMLS
    and the Controller (namespace `ray.namespace`). Idempotent: each is created only if it does not exist
    (`get_if_exists`), so a second call (a redeploy, `serve deploy` after `clawray start`) attaches and
    never duplicates. Called by the Serve app's builder (`serve run` / `serve deploy`, where they must be
    detached: the build runs in a task that ends) and by `start_system`. The Controller starts no run
    before the Serve app is RUNNING (an idle window must not start training while vLLM is starting)."""
    from cluster.controller import start_controller
    from cluster.omls_actor import start_omls
    from evolve.actor import get_or_create_evolver
    from rewards.pool import start_prm_pool
    from rewards.sinks import ReplayActorSink
    from train.replay import get_or_create_replay

    def step(msg: str) -> None:
        if progress is not None:
            progress(msg)
        log.info(msg)

    layout = StorageLayout(cfg.storage_path()).ensure()
    ns = cfg.ray.namespace
    handles: dict[str, Any] = {}
    step("Replay actor (replay buffer)")
    replay = handles[names.REPLAY] = get_or_create_replay(cfg.replay, layout, detached=detached,
                                                          state=cfg.state.model_dump(), namespace=ns)
    ray.get(replay.stats.remote())
    step("Evolver actor (skill library)")
    evolver = handles[names.EVOLVER] = get_or_create_evolver(layout.skills, cfg.skills, cfg.evolver,
                                                             detached=detached, blob_root=cfg.blob_root(),
                                                             namespace=ns, collective=collective_wiring(cfg, layout),
                                                             agent_markers=agent_markers(cfg))
    # The replay buffer follows the skill library's generation from the start (support/query split).
    # Generations never go back: a skills folder wiped or replaced since Replay last saw generation g is
    # written up to a new generation above g (its S changed), never left below (Replay would retire
    # every new sample served under the lower one).
    replay_gen = ray.get(replay.stats.remote())["generation"]
    generation = ray.get(evolver.reconcile_generation.remote(replay_gen))
    ray.get(replay.set_generation.remote(generation))
    if cfg.memory.enabled:  # before the PRMs, which tell it about every scored turn
        step("Memory actor (long-term memory)")
        handles[names.MEMORY] = start_memory(cfg, layout, detached=detached)
    step(f"PRM pool ({cfg.rewards.pool_size} actor(s))")
    workspaces = cfg.rewards.workspace_root or str(layout.root / "workspaces")
    prms = start_prm_pool(cfg.rewards, functools.partial(ReplayActorSink, names.REPLAY, ns), namespace=ns,
                          detached=detached, tokenizer_path=cfg.model_path(), workspace_root=workspaces,
                          judge_max_tokens=cfg.rewards.judge_max_tokens, engine_judge=engine_judge(cfg),
                          evolver_name=names.EVOLVER, agent_markers=agent_markers(cfg),
                          observer_names=(names.MEMORY,) if cfg.memory.enabled else ())
    handles.update(zip(sink_names(cfg), prms, strict=True))
    ray.get(evolver.start_collective.remote())  # its schedule asks OMLS (below) whether serving is idle
    step("OMLS scheduler")
    handles[names.OMLS] = start_omls(cfg.scheduler, layout.root, detached=detached, namespace=ns,
                                     state=cfg.state.model_dump())
    step(f"Controller (mode {cfg.scheduler.mode})")
    handles[names.CONTROLLER] = start_controller(cfg, detached=detached, serving_app=names.APP)
    return handles


def collective_wiring(cfg: ClawrayConfig, layout: StorageLayout) -> dict[str, Any]:
    """What the Evolver's collective job needs by name (evolve/collective_runner.py): where evidence and its
    cursor live, the engine deployment and the PRM pool its validation gate replays and grades with, and
    the OMLS actor its schedule asks whether serving is idle."""
    ns = cfg.ray.namespace
    return {"storage_root": str(layout.root), "state": cfg.state.model_dump(),
            # The gate replays with what users are served: the policy alias is the active adapter (or the base).
            "gate": {"engine": {"deployment": names.ENGINE, "app": names.APP, "model": cfg.model.policy_alias},
                     "prms": sink_names(cfg), "namespace": ns},
            "omls": [names.OMLS, ns]}


def engine_judge(cfg: ClawrayConfig) -> dict[str, str] | None:
    """Where PRM judge votes go when the served base model judges (`rewards.judge_source` resolves to
    `engine`): the engine deployment of the app, by name, and the base model's served name."""
    if cfg.rewards.resolved_judge_source() != "engine":
        return None
    return {"deployment": names.ENGINE, "app": names.APP, "model": cfg.model.served_name}


def agent_markers(cfg: ClawrayConfig) -> tuple[str, ...]:
    """What in a user message is the agent's, not the user's words (core/agent_context.py): the Proxy reads
    the same `proxy.*` keys for retrieval; memory, the evolvers and the PRMs take them from here."""
    return context_markers(cfg.proxy.agent_context_markers, cfg.proxy.extra_agent_context_markers)


def start_memory(cfg: ClawrayConfig, layout: StorageLayout, *, detached: bool = False):
    """The `Memory` actor (memory/actor.py), ready; it gets the skills plane's offline MiniLM loader as its
    embedder factory (memory/ imports no other plane)."""
    from evolve.embedding import SentenceEmbedder
    from memory.actor import get_or_create_memory

    model = cfg.memory.embedding_model
    factory = functools.partial(SentenceEmbedder, model, encoder=cfg.memory.embedding_encoder) if model else None
    handle = get_or_create_memory(str(layout.memory), cfg.memory, factory, name=names.MEMORY,
                                  namespace=cfg.ray.namespace, detached=detached, state=cfg.state.model_dump(),
                                  agent_markers=agent_markers(cfg))
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
    system = names_for(cfg) if cfg else Names(pool_size=8)
    for name in system.actors:
        try:
            ray.kill(names.actor(name, system.namespace, timeout_s=0), no_restart=True)
        except ValueError:
            pass
        names.forget(name, system.namespace)
    time.sleep(0.5)
    ray.shutdown()
