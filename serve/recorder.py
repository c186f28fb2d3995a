"""Group commit of captured turns: concurrent requests of one Proxy replica share one thread hop and one
SQLite transaction instead of paying one each.

A request still waits for its own turn to be durable before its reply (or its stream's terminal event) is
sent (DESIGN.md "Nothing lost", and the session's next request must find it); under load the wait is
shared: every request that finished while a commit was running goes into the next one. A request that
is alone (no other request of the replica waiting on the engine, nothing queued here) commits in place on
the loop when SQLite can begin at once: at one request at a time the thread hop is a third of the recording's
cost, and there is nobody for the loop to serve meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

from core.contracts import Turn
from serve.history import History
from serve.sessions import SessionStore

log = logging.getLogger("clawray.proxy")


class GroupCommit:
    """`await record(turns, history, block, prompt=...)` == `SessionStore.record`, batched. One instance per
    event loop."""

    def __init__(self, store: SessionStore, max_batch: int = 256):
        self.store, self.max_batch = store, max_batch
        self._pending: list[tuple[list[Turn], History | None, str, bytes | None, asyncio.Future]] = []
        self._running = False
        self.commits = 0  # transactions run (for tests and benchmarks: commits < records under load)
        self.in_place = 0  # of which run on the loop (`alone`)

    async def record(self, turns: list[Turn], history: History | None, block: str = "",
                     alone: bool = False, prompt: bytes | None = None) -> list[Turn]:
        """`alone`: the caller knows no other request of this replica is in flight (serve/proxy.py)."""
        if alone and not self._running and not self._pending:
            stored = self.store.try_record_batch([(turns, history, block, prompt)])
            if stored is not None:
                self.commits += 1
                self.in_place += 1
                return stored[0]
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((turns, history, block, prompt, fut))
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
                await self._commit(batch)
        finally:
            self._running = False

    async def _commit(self, batch: list[tuple[list[Turn], History | None, str, bytes | None, asyncio.Future]]) -> None:
        items = [item[:-1] for item in batch]
        try:
            results = await asyncio.to_thread(self.store.record_batch, items)
        except Exception:  # noqa: BLE001 - one bad item must not fail the others: retry them one by one
            log.warning("group commit of %d requests failed; recording them one by one", len(batch))
            await self._one_by_one(batch)
            return
        self.commits += 1
        for (*_, fut), stored in zip(batch, results, strict=True):
            if not fut.done():  # the request may have been cancelled (client went away)
                fut.set_result(stored)

    async def _one_by_one(self, batch: list[tuple[list[Turn], History | None, str, bytes | None, asyncio.Future]]) -> None:
        for turns, history, block, prompt, fut in batch:
            try:
                stored = await asyncio.to_thread(self.store.record, turns, history, block, prompt)
            except Exception as e:  # noqa: BLE001 - delivered to the waiting request, which fails with it
                if not fut.done():
                    fut.set_exception(e)
                continue
            self.commits += 1
            if not fut.done():
                fut.set_result(stored)
