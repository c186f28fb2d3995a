"""The outbox dispatcher's claims: short leases renewed while a sink call runs, so a dead replica's claims
come back quickly and a live replica's slow call is not delivered twice."""

from __future__ import annotations

import asyncio
import time

from core.contracts import Turn
from serve.outbox import Dispatcher
from serve.sessions import SessionStore


def _turn(sid: str) -> Turn:
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-1.0],
                last_in_session=True)


class SlowSink:
    def __init__(self, seconds: float):
        self.seconds, self.calls = seconds, 0

    async def submit(self, turns):
        self.calls += 1
        await asyncio.sleep(self.seconds)


async def test_a_slow_sink_call_keeps_its_claim_and_a_dead_claimer_loses_it(tmp_path, state_cfg):
    store = SessionStore(tmp_path / "s.db", state_cfg)
    store.record([_turn("a")], None)
    sink = SlowSink(1.2)
    d = Dispatcher(store, sink, idle_s=3600, lease_s=0.45)
    d.start()
    try:
        await asyncio.sleep(0.6)  # claimed; the lease (0.45 s) would have expired without renewals
        assert sink.calls == 1
        assert store.claim(10, 60) == []  # renewed by the heartbeat: nobody else can take it
        await asyncio.sleep(1.2)
        assert d.dispatched == 1 and store.stats().get("dispatched") == 1
    finally:
        await d.stop()

    # A claimer that died mid-call renews nothing: the turn is claimable again after `lease_s`.
    store.record([_turn("b")], None)
    (t,) = store.claim(10, 0.3)
    assert store.claim(10, 0.3) == []
    time.sleep(0.35)
    assert [x.turn_id for x in store.claim(10, 0.3)] == [t.turn_id]
    store.close()
