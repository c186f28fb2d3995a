"""The OMLS actor on the local Ray cluster: persistence across a restart, activity reports."""

from __future__ import annotations

import time

from core.config import SchedulerConfig


def _cfg(**kw) -> SchedulerConfig:
    # Only the signals a test asks for: no sleep hours (they depend on the wall clock).
    base = dict(sleep_start=None, sleep_end=None, idle_minutes=None, min_window_minutes=0, poll_s=0.2)
    return SchedulerConfig(**(base | kw))


def _wait(predicate, timeout_s: float = 30.0, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - the actor is restarting; calls fail until it is back
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met in {timeout_s}s") from e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout_s}s")
        time.sleep(every_s)


def test_actor_persists_state_and_restores_it_after_restart(ray_cluster, tmp_path):
    from cluster.omls_actor import start_omls
    from core.kv import control_store

    ray = ray_cluster
    actor = start_omls(_cfg(idle_minutes=60), tmp_path, name="OMLS-test-restart")
    try:
        ray.get(actor.report_activity.remote(time.time()))
        transitions = ray.get(actor.trigger_now.remote())
        assert [t["dst"] for t in transitions] == ["window_open"]
        _, doc = control_store(tmp_path).get("omls")  # persisted before the call returned
        assert doc["omls"]["state"] == "window_open" and doc["omls"]["manual"] is True
        assert [a["action"] for a in doc["pending_actions"]] == ["start_training"]
        before = ray.get(actor.state.remote())

        ray.kill(actor, no_restart=False)

        def restarted():
            # ray.kill is asynchronous: the old incarnation may still answer a call or two.
            state = ray.get(actor.state.remote(), timeout=5)
            return state if state["actor_started_at"] != before["actor_started_at"] else None

        state = _wait(restarted)
        since = before["since"]
        assert (state["state"], state["manual"], state["since"]) == ("window_open", True, since)
        assert state["open_signals"] == [] and state["pending_actions"] == 1
        assert state["last_activity"] == before["last_activity"]  # the inactivity timer survives

        actions = ray.get(actor.pending_actions.remote())
        assert [a["action"] for a in actions] == ["start_training"]
        assert ray.get(actor.pending_actions.remote()) == []
        ray.get(actor.training_started.remote())
        assert ray.get(actor.state.remote())["state"] == "updating"
        ray.get(actor.training_stopped.remote())  # the manual run has happened
        assert ray.get(actor.state.remote())["state"] == "idle_wait"
    finally:
        ray.kill(actor, no_restart=True)


def test_report_activity_keeps_the_window_closed(ray_cluster, tmp_path):
    from cluster.omls_actor import start_omls

    ray = ray_cluster
    actor = start_omls(_cfg(idle_minutes=2 / 60), tmp_path, name="OMLS-test-activity")  # 2 s threshold
    try:
        for _ in range(15):  # 3 s of traffic, longer than the threshold
            ray.get(actor.report_activity.remote(time.time()))
            time.sleep(0.2)
            assert ray.get(actor.state.remote())["state"] == "idle_wait"
        _wait(lambda: ray.get(actor.state.remote())["state"] == "window_open", timeout_s=10)
        state = ray.get(actor.state.remote())
        assert state["open_signals"] == ["proxy_inactivity"] and state["last_activity"] is not None
        assert [a["action"] for a in ray.get(actor.pending_actions.remote())] == ["start_training"]

        ray.get(actor.report_activity.remote(time.time()))  # the user is back
        _wait(lambda: ray.get(actor.state.remote())["state"] == "idle_wait", timeout_s=10)
        assert [a["action"] for a in ray.get(actor.pending_actions.remote())] == ["cancel_training"]
    finally:
        ray.kill(actor, no_restart=True)
