"""Every Ray name of the system in one place, and the one named-actor lookup.

Names. The namespace comes from the config (`ray.namespace`, `names_for(cfg)`); the names of the named
actors, of the Serve app and of its deployments are fixed here, so no plane spells another plane's
actor name (DESIGN.md "Planes and folders"). The namespace is not process-wide state: the composition
root (cluster/system.py, cluster/serve_app.py) hands it to every actor and replica it starts, because
code in a Serve replica runs in Serve's own namespace and code in a Ray Train worker in its driver's, so
a lookup without an explicit namespace would search the wrong one. The Serve app's name is fixed
(`APP`): Serve apps are not namespaced and configs/serve.yaml names it too.

Lookup. `actor(name, namespace)` caches handles per (Ray session, namespace, name), retries
`ray.get_actor` with a capped exponential backoff (`backoff_s`) while the actor is not there yet (being
created, or recreated after a crash), and raises `ActorNotFoundError` (a ValueError, like Ray's own) once
`timeout_s` is spent. A handle whose calls fail because the actor died goes stale: callers drop it with
`forget` (or `forget_if_dead` around the call), so the next lookup resolves the name again. An actor
restarted by Ray (`max_restarts`) keeps its handle; one killed and created anew does not, so every
get-or-create function forgets the name in the creating process, and an existence check asks Ray
(`fresh=True`), not the cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.config import ClawrayConfig

DEFAULT_NAMESPACE = "clawray"  # `ray.namespace`'s default

# Named actors (DESIGN.md), each in the configured namespace.
REPLAY = "Replay"  # train/replay.py
EVOLVER = "Evolver"  # evolve/actor.py
MEMORY = "Memory"  # memory/actor.py
OMLS = "OMLS"  # cluster/omls_actor.py
CONTROLLER = "Controller"  # cluster/controller.py
SYSTEM_ACTORS = (REPLAY, EVOLVER, MEMORY, OMLS, CONTROLLER)  # besides the PRM pool

# The Serve app and its deployments.
APP = "clawray"
PROXY = "Proxy"
ENGINE = "PolicyEngine"  # the engine deployment, or the co-located one that stands in for it

LOOKUP_TIMEOUT_S = 10.0  # how long `actor` waits for a name to appear, by default
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


def prm_name(i: int) -> str:
    """Member `i` of the `PRM` actor pool."""
    return f"PRM-{i}"


def control_name(run_name: str) -> str:
    """The `TrainControl` actor of training run `run_name` (train/control.py)."""
    return f"TrainControl-{run_name}"


@dataclass(frozen=True)
class Names:
    """The Ray names of one deployment of the system: all fixed but the namespace and the PRM pool's size."""

    namespace: str = DEFAULT_NAMESPACE
    pool_size: int = 0

    @property
    def prms(self) -> list[str]:
        return [prm_name(i) for i in range(self.pool_size)]

    @property
    def actors(self) -> list[str]:
        """Every named actor the system may run (`Memory` only when memory is on)."""
        return [*SYSTEM_ACTORS, *self.prms]


def names_for(cfg: ClawrayConfig) -> Names:
    """The names of the system `cfg` describes (namespace `ray.namespace`)."""
    return Names(cfg.ray.namespace, cfg.rewards.pool_size)


class ActorNotFoundError(ValueError):
    """No actor of that name in that namespace, within the lookup's timeout."""

    def __init__(self, name: str, namespace: str, timeout_s: float):
        super().__init__(f"no Ray actor {name!r} in namespace {namespace!r} after {timeout_s:g} s: is the "
                         "system started (`clawray start`, `serve run configs/serve.yaml`), with this "
                         "`ray.namespace`?")
        self.name, self.namespace = name, namespace


def backoff_s(attempt: int, first_s: float = FIRST_BACKOFF_S, max_s: float = MAX_BACKOFF_S) -> float:
    """The pause after failed lookup number `attempt` (0-based): doubling from `first_s`, at most `max_s`."""
    return min(max_s, first_s * 2 ** min(attempt, 32))


_CACHE: dict[tuple[str, str, str], Any] = {}  # (Ray node id, namespace, name) -> handle
# Seams for the tests (a fake clock makes the timeout deterministic).
_sleep = time.sleep
_clock = time.monotonic


def _key(name: str, namespace: str) -> tuple[str, str, str] | None:
    """The cache key; None (no caching) outside a Ray session. The node id keeps a handle of one Ray
    session from being served in the next (a test's cluster, a restarted local cluster)."""
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id(), namespace, name


def cached(name: str, namespace: str) -> Any | None:
    """The cached handle of `name`, or None (no Ray call: safe on an event loop)."""
    key = _key(name, namespace)
    return None if key is None else _CACHE.get(key)


def actor(name: str, namespace: str, *, timeout_s: float = LOOKUP_TIMEOUT_S, fresh: bool = False) -> Any:
    """The handle of the named actor `name` in `namespace`: cached, else looked up, retrying with
    `backoff_s` pauses until it exists or `timeout_s` is spent (0: one try). Blocking. `fresh`: ask Ray
    even when a handle is cached (whether the actor exists now), and cache its answer.

    Raises:
        ActorNotFoundError: no such actor after `timeout_s`.
    """
    import ray

    if not fresh and (handle := cached(name, namespace)) is not None:
        return handle
    deadline, attempt = _clock() + timeout_s, 0
    while True:
        try:
            handle = ray.get_actor(name, namespace=namespace)
            break
        except ValueError as e:  # Ray's "Failed to look up actor": not created yet, or dead for good
            left = deadline - _clock()
            if left <= 0:
                raise ActorNotFoundError(name, namespace, timeout_s) from e
            _sleep(min(backoff_s(attempt), left))
            attempt += 1
    if (key := _key(name, namespace)) is not None:
        _CACHE[key] = handle
    return handle


async def actor_async(name: str, namespace: str, *, timeout_s: float = LOOKUP_TIMEOUT_S) -> Any:
    """`actor` for a caller on an event loop: a cached handle at once, a lookup in a worker thread."""
    if (handle := cached(name, namespace)) is not None:
        return handle
    return await asyncio.to_thread(actor, name, namespace, timeout_s=timeout_s)


def forget(name: str, namespace: str) -> None:
    """Drop the cached handle of `name`: the next `actor` call resolves the name again."""
    if (key := _key(name, namespace)) is not None:
        _CACHE.pop(key, None)


@contextmanager
def forget_if_dead(name: str, namespace: str) -> Iterator[None]:
    """Around calls on a cached handle: when one fails because the actor died or cannot be reached
    (`RayActorError`: ActorDiedError, ActorUnavailableError), drop the handle and re-raise, so the next
    lookup finds the actor's new incarnation."""
    from ray.exceptions import RayActorError

    try:
        yield
    except RayActorError:
        forget(name, namespace)
        raise
