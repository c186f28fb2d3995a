"""A user whose request is still running is not away: the Proxy reports activity when a main turn ends,
not only when it starts. (The demo failed on this under load: one turn on the CPU engine took longer than
OMLS's 30-second inactivity threshold, a window opened while the users' requests were in flight, and the
next request closed it before a single GRPO step.) In-process over the fake engine of
test_serve_responses_route; the clock is injected, no sleeps."""

from __future__ import annotations

import asyncio

from serve.apis import CHAT
from tests.unit.test_serve_responses_route import FakeEngine, _request, proxy  # noqa: F401 - the fixture


class Recorder:
    """Stands in for the ActivityReporter's sending side: records the times noted."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.noted = clock, []

    def note(self) -> None:
        self.noted.append(self.clock[0])


def test_a_main_turn_that_outlasts_the_threshold_reports_activity_when_it_ends(proxy, monkeypatch):  # noqa: F811
    clock = [1000.0]
    proxy.activity = Recorder(clock)
    engine: FakeEngine = proxy.engine._target
    chat = engine.chat

    async def slow_chat(body):  # the engine works for 45 s of (injected) time
        clock[0] += 45.0
        return await chat(body)

    monkeypatch.setattr(engine, "chat", slow_chat)
    body = {"model": "clawray-policy", "messages": [{"role": "user", "content": "hi"}]}
    response = asyncio.run(proxy.handle(_request(body, x_session_id="a1"), CHAT))
    assert response.status_code == 200
    assert proxy.activity.noted[0] == 1000.0
    assert proxy.activity.noted[-1] == 1045.0, "the turn's end was not reported as activity"
