"""`Replay`: the named Ray actor that owns the replay store (thin wrapper around `ReplayStore`).

Name `Replay`, in the configured namespace (`ray.namespace`; names: core/names.py), restarted forever (`max_restarts=-1`): the store is durable, so a
restarted actor reopens the same buffer (the SQLite file under the storage root's `replay/`, or the
PostgreSQL schema when `state.dsn` is set) and loses nothing that was acknowledged. Calls are retried
after a restart: `append` is idempotent (sample ids), a retried `lease` at worst leaves one orphan lease
that expires and is re-delivered, a retried `begin_evolution` one orphan fence that refuses seals until
it expires (`evolve.loop.fence_ttl_s`).

The evolution fence (`begin_evolution` / `end_evolution`), the training step's commit point (`seal`)
and the dead letters (`dead_letter`, `dead_letters`, `requeue`, `drop`) are ReplayStore's; see there.

Also exports gauges through `ray.util.metrics` (Prometheus via the Ray metrics agent):
`clawray_replay_samples{state}`, `clawray_replay_samples_current_generation{state}`,
`clawray_replay_stale_retired`, `clawray_replay_generation`, `clawray_replay_oldest_fresh_age_s`,
`clawray_replay_dead_letters`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray
from ray.util.metrics import Gauge

from core import names
from core.config import ReplayConfig, StateConfig
from core.contracts import Sample
from core.metrics import hold
from core.storage import StorageLayout
from train.replay_store import STATES, ReplayStore

DB_FILE = "replay.sqlite"
EXPORT_EVERY_S = 5.0  # stats() walks an index: throttle the gauges instead of updating per call


@ray.remote(num_cpus=0.1, max_restarts=-1, max_task_retries=3)
class Replay:
    def __init__(self, cfg: ReplayConfig, root: str, state: dict | None = None,
                 storage_root: str | None = None) -> None:
        self._store = ReplayStore(Path(root) / DB_FILE, default_lease_s=cfg.lease_timeout_s, state=state,
                                  storage_root=Path(storage_root) if storage_root else None)
        self._gauges = {
            "samples": Gauge("clawray_replay_samples", "replay samples by state", tag_keys=("state",)),
            "current": Gauge(
                "clawray_replay_samples_current_generation",
                "replay samples of the current skill generation by state", tag_keys=("state",),
            ),
            "stale": Gauge("clawray_replay_stale_retired", "samples retired by a skill generation bump"),
            "generation": Gauge("clawray_replay_generation", "current skill generation"),
            "age": Gauge("clawray_replay_oldest_fresh_age_s", "age of the oldest trainable sample"),
            "dead": Gauge("clawray_replay_dead_letters", "samples the trainer rejected (dead letters)"),
        }
        self._exported = 0.0
        self._export(force=True)

    def _export(self, force: bool = False) -> dict[str, Any] | None:
        if not force and time.monotonic() - self._exported < EXPORT_EVERY_S:
            return None
        self._exported = time.monotonic()
        st = self._store.stats()
        current = st["by_generation"].get(str(st["generation"]), {})
        for state in STATES:  # held (core/metrics.py): set again between calls, or Ray drops them
            hold(self._gauges["samples"], st["by_state"].get(state, 0), {"state": state})
            hold(self._gauges["current"], current.get(state, 0), {"state": state})
        hold(self._gauges["stale"], st["by_state"]["retired"])
        hold(self._gauges["generation"], st["generation"])
        hold(self._gauges["age"], st["oldest_fresh_age_s"] or 0.0)
        hold(self._gauges["dead"], st["dead_letters"])
        return st

    def append(self, samples: list[Sample]) -> int:
        """Durably store samples; returns how many were new. Returns only after the commit."""
        n = self._store.append(samples)
        self._export()
        return n

    def set_generation(self, generation: int) -> int:
        n = self._store.set_generation(generation)
        self._export(force=True)
        return n

    def mark_support(self, ids: list[str]) -> int:
        return self._store.mark_support(ids)

    def begin_evolution(self, ids: list[str], ttl_s: float) -> tuple[str, list[str]]:
        return self._store.begin_evolution(ids, ttl_s)

    def end_evolution(self, token: str, new_generation: int | None, release_ids: list[str]) -> dict:
        out = self._store.end_evolution(token, new_generation, release_ids)
        self._export(force=new_generation is not None)
        return out

    def seal(self, lease_id: str, sample_ids: list[str]) -> tuple[bool, str]:
        return self._store.seal(lease_id, sample_ids)

    def dead_letter(self, sample_ids: list[str], error: str) -> int:
        n = self._store.dead_letter(sample_ids, error)
        self._export(force=True)
        return n

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._store.dead_letters(limit)

    def requeue(self, sample_ids: list[str]) -> int:
        n = self._store.requeue(sample_ids)
        self._export(force=True)
        return n

    def drop(self, sample_ids: list[str]) -> int:
        n = self._store.drop(sample_ids)
        self._export(force=True)
        return n

    def lease(
        self, batch_size: int, lease_s: float | None = None, owner: str | None = None, min_size: int = 1
    ) -> tuple[str | None, list[Sample]]:
        out = self._store.lease(batch_size, lease_s, owner=owner, min_size=min_size)
        self._export()
        return out

    def commit(self, lease_id: str) -> int:
        n = self._store.commit(lease_id)
        self._export()
        return n

    def release(self, lease_id: str) -> int:
        return self._store.release(lease_id)

    def release_owner(self, owner: str) -> int:
        return self._store.release_owner(owner)

    def release_expired(self) -> int:
        return self._store.release_expired()

    def rollout_candidates(self, limit: int) -> list[Sample]:
        return self._store.rollout_candidates(limit)

    def states(self, sample_ids: list[str]) -> dict[str, str]:
        return self._store.states(sample_ids)

    def stats(self) -> dict[str, Any]:
        return self._export(force=True)


def get_or_create_replay(cfg: ReplayConfig, storage: StorageLayout, *, detached: bool = False,
                         state: StateConfig | dict | None = None, namespace: str = names.DEFAULT_NAMESPACE):
    """The `Replay` actor handle, created if it does not exist yet: its buffer in `state` (the config's
    `state` section; none or no dsn = the SQLite file under `storage.replay`, checked against the storage
    root by core.state.check_embedded).

    `detached=True` lets it outlive the creating process (a CLI that wires a long-lived cluster);
    `namespace`: the Ray namespace it is named in (`ray.namespace`).
    """
    opts: dict[str, Any] = {"name": names.REPLAY, "namespace": namespace, "get_if_exists": True}
    if detached:
        opts["lifetime"] = "detached"
    state = state.model_dump() if isinstance(state, StateConfig) else state
    names.forget(names.REPLAY, namespace)  # a handle this process cached may be of a killed incarnation
    return Replay.options(**opts).remote(cfg, str(storage.replay), state=state, storage_root=str(storage.root))

