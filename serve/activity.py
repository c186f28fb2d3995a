"""Tells the `OMLS` scheduler that the user is active (every Proxy replica reports its traffic).

Reports are throttled (one per `interval_s` per replica) and fire-and-forget: a missing or dead OMLS
actor never slows or fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("clawray.activity")


class ActivityReporter:
    def __init__(self, actor_name: str = "OMLS", namespace: str = "clawray", interval_s: float = 2.0):
        self.actor_name, self.namespace, self.interval_s = actor_name, namespace, interval_s
        self._last = 0.0
        self._handle = None
        self._busy = False

    def note(self) -> None:
        now = time.time()
        if now - self._last < self.interval_s or self._busy:
            return
        self._last, self._busy = now, True
        asyncio.get_running_loop().create_task(self._send(now))

    async def _send(self, ts: float) -> None:
        try:
            if self._handle is None:
                import ray

                if not ray.is_initialized():  # not in a Ray worker: never let get_actor start/join a cluster
                    self._last = time.time() + 30.0
                    return
                self._handle = await asyncio.to_thread(ray.get_actor, self.actor_name, self.namespace)
            self._handle.report_activity.remote(ts)
        except ValueError:  # no OMLS actor (serving alone): look again in a while, not every request
            self._handle = None
            self._last = time.time() + 30.0
        except Exception as e:  # noqa: BLE001 - reporting must never affect serving
            log.debug("activity report failed: %s", e)
            self._handle = None
        finally:
            self._busy = False
