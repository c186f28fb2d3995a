"""Starting the `PRM` actor pool and a small client-side wrapper that spreads turns over it."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import ray

from core import names
from core.config import RewardsConfig
from core.contracts import Turn
from rewards.prm import PRM
from rewards.sinks import SampleSink

READY_TIMEOUT_S = 120.0


def start_prm_pool(
    cfg: RewardsConfig,
    sink_factory: Callable[[], SampleSink],
    n: int | None = None,
    *,
    namespace: str = names.DEFAULT_NAMESPACE,
    detached: bool = False,
    num_cpus: float = 0.1,
    **prm_kwargs: Any,
) -> list[Any]:
    """Start (or reuse) named actors `PRM-0 .. PRM-{n-1}` and wait until each is ready.

    Args:
        cfg: the rewards section (`pool_size` when `n` is None, `max_concurrency` per actor).
        sink_factory: builds each actor's sink inside the actor (see `PRM`).
        n: pool size (default `cfg.pool_size`).
        namespace: the Ray namespace of the actors and of the ones they deliver to (`ray.namespace`).
        detached: outlive the driver (`lifetime="detached"`).
        num_cpus: logical CPUs per actor (scoring waits on I/O, so a fraction).
        prm_kwargs: forwarded to `PRM` (tokenizer_path, workspace_root, ...).
    Returns:
        the actor handles, in name order. Raises ConfigError (e.g. an OPD teacher with another
        tokenizer) before returning, so a bad config fails at startup rather than per turn.
    """
    n = cfg.pool_size if n is None else n
    for i in range(n):  # a handle this process cached may be of a killed incarnation
        names.forget(names.prm_name(i), namespace)
    actor_cls = ray.remote(PRM)
    handles = [
        actor_cls.options(
            name=names.prm_name(i),
            namespace=namespace,
            lifetime="detached" if detached else None,
            get_if_exists=True,
            max_restarts=-1,  # restarted on failure; unacknowledged turns are re-sent by the outbox
            max_concurrency=cfg.max_concurrency,
            num_cpus=num_cpus,
        ).remote(cfg, sink_factory, namespace=namespace, **prm_kwargs)
        for i in range(n)
    ]
    ray.get([h.ready.remote() for h in handles], timeout=READY_TIMEOUT_S)
    return handles


class PRMPool:
    """Spreads turns over PRM actors, one session always to the same actor.

    Routing is by a stable hash of the session id rather than strict round-robin, because the
    "at least one trainable sample per session" rule keeps per-session state in the scoring actor;
    with many sessions the load still spreads evenly.
    """

    def __init__(self, handles: list[Any]):
        if not handles:
            raise ValueError("PRMPool needs at least one PRM actor handle")
        self.handles = list(handles)

    @classmethod
    def from_names(cls, n: int, namespace: str = names.DEFAULT_NAMESPACE) -> PRMPool:
        """Attach to a running pool by name (e.g. from the serving plane)."""
        return cls([names.actor(names.prm_name(i), namespace) for i in range(n)])

    def pick(self, session_id: str) -> Any:
        return self.handles[zlib.crc32(session_id.encode()) % len(self.handles)]

    def score(self, turn: Turn) -> Any:
        """ObjectRef of `PRM.score(turn)` (await it, or `ray.get`)."""
        return self.pick(turn.session_id).score.remote(turn)
