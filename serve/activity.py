"""Tells the `OMLS` scheduler that the user is active (every Proxy replica reports its traffic).

Reports are throttled (one per `interval_s` per replica) and fire-and-forget: a missing or dead OMLS
actor never slows or fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import time

from core import names

log = logging.getLogger("clawray.activity")


class ActivityReporter:
    def __init__(self, actor_name: str = names.OMLS, namespace: str = names.DEFAULT_NAMESPACE,
                 interval_s: float = 2.0):
        self.actor_name, self.namespace, self.interval_s = actor_name, namespace, interval_s
        self._last = 0.0
        self._busy = False

    def note(self) -> None:
        now = time.time()
        if now - self._last < self.interval_s or self._busy:
            return
        self._last, self._busy = now, True
        asyncio.get_running_loop().create_task(self._send(now))

    async def _send(self, ts: float) -> None:
        try:
            import ray

            if not ray.is_initialized():  # not in a Ray worker: never let get_actor start/join a cluster
                self._last = time.time() + 30.0
                return
            handle = await names.actor_async(self.actor_name, self.namespace, timeout_s=0)
            handle.report_activity.remote(ts)
        except ValueError:  # no OMLS actor (serving alone): look again in a while, not every request
            self._last = time.time() + 30.0
        except Exception as e:  # noqa: BLE001 - reporting must never affect serving
            log.debug("activity report failed: %s", e)
            names.forget(self.actor_name, self.namespace)
        finally:
            self._busy = False
