"""Where completed turns go: a scoring sink behind one interface, fed by a durable outbox dispatcher.

Sinks: `JsonlTurnSink` (durable local file, the default until a PRM pool runs) and `ActorPoolSink` (the
named `PRM-i` actors of the rewards plane, reached by name, so serve/ never imports rewards/). A sink
raises when it could not take a turn; the dispatcher then leaves the turn in the outbox and retries later,
so a dead or slow scorer never blocks serving and never loses a turn.

Poison turns: a failure is counted against a turn only when it is the turn's own (the scorer raised on
it). An outage is not: an error marked `retryable` (the rewards plane's JudgeUnavailable,
TeacherUnavailable, SinkUnavailable; our `SinkUnreachable`: no actor, an unavailable one, a timeout, the
file not writable). The actor dying during the call counts: a turn that kills its scorer is poison.
After `max_failures` counted failures the turn becomes a dead letter (serve/sessions.py), so one bad turn
is never re-sent forever, and a scorer outage never dead-letters healthy turns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from pathlib import Path
from typing import Protocol

from core import names
from core.contracts import Turn
from serve.sessions import SessionStore, TurnLine

log = logging.getLogger("clawray.outbox")


class TurnSink(Protocol):
    # True: `submit` gets each turn as its JSON (`TurnLine`), not as a `Turn` (parsing and re-serialising
    # a turn's ~3,000 prompt ids cost more than everything else the dispatcher does with it).
    takes_lines: bool

    async def submit(self, turns: list[Turn] | list[TurnLine]) -> None:
        """Take `turns` durably or raise; must be idempotent per `turn_id` (re-delivery happens).
        `DeliveryFailed` says which turns were not taken (the others were); any other error: none was."""


class SinkUnreachable(RuntimeError):
    """The sink could not be reached or written: an outage, retried, never counted against a turn."""

    retryable = True


class DeliveryFailed(Exception):
    """Some turns of a batch were not taken; `errors` maps their turn ids to what failed."""

    def __init__(self, errors: dict[str, BaseException]):
        super().__init__(f"{len(errors)} turn(s) not taken")
        self.errors = errors


def is_outage(error: BaseException) -> bool:
    """Whether `error` says the scorer is unavailable rather than that the turn is bad. The flag survives
    Ray's wrapping of a remote error (a RayTaskError subclasses the raised class)."""
    return bool(getattr(error, "retryable", False))


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class JsonlTurnSink:
    """Appends completed turns to a JSON-lines file, fsync'd before returning."""

    takes_lines = True

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, turns: list[TurnLine]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(t.json + "\n" for t in turns))
            f.flush()
            os.fsync(f.fileno())

    async def submit(self, turns: list[TurnLine]) -> None:
        try:
            await asyncio.to_thread(self._write, turns)
        except OSError as e:  # a full or read-only disk is an outage, not a bad turn
            raise SinkUnreachable(f"cannot append to {self.path}: {e}") from e


class ActorPoolSink:
    """Calls `score(turn)` on named actors; a turn counts as taken when that returns.

    A session always goes to the same actor (crc32 of its id): the rewards plane keeps per-session
    state (the "at least one trainable sample per session" rule).
    """

    takes_lines = False

    def __init__(self, actors: list[str], namespace: str = names.DEFAULT_NAMESPACE, timeout_s: float = 120.0):
        self.actors, self.namespace, self.timeout_s = actors, namespace, timeout_s

    async def _actor(self, name: str):
        try:  # cached (core/names.py); a miss is a GCS lookup, off the event loop, once per actor
            return await names.actor_async(name, self.namespace, timeout_s=0)
        except ValueError as e:  # no such actor (yet): the rewards plane is down or starting
            raise SinkUnreachable(f"no scoring actor {name!r}") from e

    async def _one(self, turn: Turn) -> None:
        from ray.exceptions import ActorUnavailableError

        name = self.actors[zlib.crc32(turn.session_id.encode()) % len(self.actors)]
        try:
            actor = await self._actor(name)
            await asyncio.wait_for(actor.score.remote(turn), self.timeout_s)
        except TimeoutError as e:  # a slow scorer (its judge calls have their own timeouts): an outage
            names.forget(name, self.namespace)
            raise SinkUnreachable(f"{name} did not answer within {self.timeout_s:.0f}s") from e
        except ActorUnavailableError as e:  # restarting or unreachable for now: an outage
            names.forget(name, self.namespace)
            raise SinkUnreachable(f"{name} is unavailable: {e}") from e
        except BaseException:  # the actor died during the call (a turn that kills its scorer is poison)
            names.forget(name, self.namespace)  # look the actor up again next time (it may be a new one)
            raise

    async def submit(self, turns: list[Turn]) -> None:
        results = await asyncio.gather(*(self._one(t) for t in turns), return_exceptions=True)
        errors = {t.turn_id: r for t, r in zip(turns, results, strict=True) if isinstance(r, BaseException)}
        for e in errors.values():
            if not isinstance(e, Exception):  # cancellation and the like are not delivery results
                raise e
        if errors:
            raise DeliveryFailed(errors)


class Dispatcher:
    """Background loop of one Proxy replica: flush idle sessions, drain the outbox into the sink.

    Claims are short leases (`lease_s`) that a heartbeat renews while the sink call runs (a judge may
    take minutes): when a replica dies mid-dispatch, its turns are claimable by the other (or the
    restarted) replica within `lease_s` instead of after the longest possible sink call. A renewal that
    comes late at worst delivers a turn twice, which sinks ignore (idempotent per `turn_id`).
    """

    def __init__(self, store: SessionStore, sink: TurnSink, idle_s: float, interval_s: float = 0.5,
                 batch: int = 64, lease_s: float = 15.0, retry_s: float = 5.0,
                 retention_s: float = 86400.0, prune_every_s: float = 60.0, max_failures: int = 5,
                 checkpoint_every_s: float = 0.25):
        self.store, self.sink = store, sink
        self.idle_s, self.interval_s, self.batch = idle_s, interval_s, batch
        self.lease_s, self.retry_s, self.max_failures = lease_s, retry_s, max_failures
        self.retention_s, self.prune_every_s = retention_s, prune_every_s
        self.checkpoint_every_s = checkpoint_every_s
        self._next_flush = self._next_prune = 0.0  # housekeeping is time-gated, not run per batch
        self.dispatched = 0
        self.failures = 0
        self.dead_lettered = 0  # turns this replica moved to the dead letters (a metric)
        self._inflight: set[str] = set()  # claimed turn ids whose sink call has not returned yet
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run()), loop.create_task(self._heartbeat())]
        # The store's WAL checkpoints run here, in a thread, instead of inside the commit of whichever request
        # crosses SQLite's threshold (that request's reply waited 2-8 ms, ~1 request in 80: docs/serving.md).
        if self.store.defer_checkpoints():
            self._tasks.append(loop.create_task(self._checkpoints()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _checkpoints(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_every_s)
            try:
                await asyncio.to_thread(self.store.checkpoint)
            except Exception:  # noqa: BLE001 - commits checkpoint themselves past the backstop meanwhile
                log.exception("session store checkpoint failed")

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self._inflight:
                try:
                    await asyncio.to_thread(self.store.extend, list(self._inflight), self.lease_s)
                except Exception:  # noqa: BLE001 - a missed renewal only risks a duplicate delivery
                    log.exception("outbox lease renewal failed")

    async def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + self.interval_s
            await asyncio.to_thread(self.store.flush_idle, self.idle_s)
        if now >= self._next_prune:
            self._next_prune = now + self.prune_every_s
            await asyncio.to_thread(self.store.prune, self.retention_s)

    async def drain_once(self) -> int:
        await self._housekeeping()
        claim = self.store.claim_lines if getattr(self.sink, "takes_lines", False) else self.store.claim
        turns = await asyncio.to_thread(claim, self.batch, self.lease_s)
        if not turns:
            return 0
        ids = [t.turn_id for t in turns]
        self._inflight.update(ids)
        errors: dict[str, BaseException] = {}
        try:
            await self.sink.submit(turns)
        except DeliveryFailed as e:
            errors = e.errors
        except Exception as e:  # noqa: BLE001 - any sink failure means "retry later", never "drop"
            errors = dict.fromkeys(ids, e)
        finally:
            self._inflight.difference_update(ids)
        taken = [i for i in ids if i not in errors]
        if taken:
            await asyncio.to_thread(self.store.mark_dispatched, taken)
            self.dispatched += len(taken)
        if errors:
            await self._failed(errors)
        return len(taken)

    async def _failed(self, errors: dict[str, BaseException]) -> None:
        """Outages: retry later, nothing counted. The turn's own errors: counted, dead at `max_failures`."""
        self.failures += 1
        by_error: dict[tuple[bool, str], list[str]] = {}
        for turn_id, e in errors.items():
            by_error.setdefault((is_outage(e), describe(e)), []).append(turn_id)
        for (outage, text), ids in by_error.items():
            log.warning("scoring sink refused %d turns (%s); retrying in %.0fs", len(ids), text[:300], self.retry_s)
            if outage:
                await asyncio.to_thread(self.store.release, ids, self.retry_s, text)
                continue
            dead = await asyncio.to_thread(self.store.fail, ids, text, self.retry_s, self.max_failures)
            if dead:
                self.dead_lettered += dead
                log.error("%d turns failed scoring %d times and became dead letters (`clawray dlq list`): %s",
                          dead, self.max_failures, text[:300])

    async def _run(self) -> None:
        while True:
            try:
                n = await self.drain_once()
            except Exception:  # noqa: BLE001 - keep the loop alive; the store is retried next tick
                log.exception("outbox dispatch failed")
                n = 0
            if n < self.batch:
                await asyncio.sleep(self.interval_s)
