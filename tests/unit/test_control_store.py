"""core/kv.py: the versioned control-state store, on both backends (`state_cfg`), and the OMLS actor's
persistence through it (issue 13).

Races are threads released together by a barrier; "another process" is another `KVStore` on the same
file or PostgreSQL namespace.
"""

from __future__ import annotations

import threading
import time

import pytest

from core.kv import Conflict, KVStore, adopt_json, control_store
from core.storage import atomic_write_json


@pytest.fixture
def open_store(state_cfg, tmp_path):
    """`open_store()`: a `KVStore` on this test's backend, each call another process's view of the same
    store; all closed at the end."""
    opened: list[KVStore] = []

    def make() -> KVStore:
        opened.append(control_store(tmp_path / "root", state_cfg))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


def test_put_writes_only_over_the_version_the_writer_read(open_store):
    kv = open_store()
    assert kv.get("controller") is None
    assert kv.put("controller", {"runs": 1}, 0) == 1
    assert kv.put("controller", {"runs": 2, "history": [{"at": 1.5}]}, 1) == 2
    with pytest.raises(Conflict, match="expected version 1, found version 2") as stale:
        kv.put("controller", {"runs": 99}, 1)  # read version 1, someone wrote version 2 since
    assert (stale.value.expected, stale.value.actual) == (1, 2)
    with pytest.raises(Conflict, match="found version 2"):
        kv.put("controller", {"runs": 0}, 0)  # "create" over an existing key
    with pytest.raises(Conflict, match="no such key"):
        kv.put("omls", {}, 3)
    assert kv.get("controller") == (2, {"runs": 2, "history": [{"at": 1.5}]})
    assert open_store().get("controller") == (2, {"runs": 2, "history": [{"at": 1.5}]})  # durable, shared
    assert kv.get("omls") is None


def test_put_latest_writes_whatever_the_version(open_store):
    kv = open_store()
    assert kv.put_latest("omls", {"state": "idle_wait"}) == 1
    assert kv.put_latest("omls", {"state": "window_open"}) == 2
    assert open_store().get("omls") == (2, {"state": "window_open"})


@pytest.mark.parametrize("expected", [0, 1], ids=["create", "update"])
def test_of_writers_racing_from_one_version_exactly_one_wins(open_store, expected):
    n = 6
    stores = [open_store() for _ in range(n)]
    if expected:
        stores[0].put("k", "v1", 0)
    barrier = threading.Barrier(n)
    won: list[int] = []
    lost: list[Conflict] = []

    def write(i: int) -> None:
        barrier.wait()  # every writer tries at once
        try:
            stores[i].put("k", f"writer {i}", expected)
            won.append(i)
        except Conflict as e:
            lost.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == n - 1
    assert all(e.actual == expected + 1 for e in lost)
    assert stores[0].get("k") == (expected + 1, f"writer {won[0]}")


def test_a_legacy_json_file_is_adopted_once_and_never_overwrites_newer_state(open_store, tmp_path):
    legacy = tmp_path / "root" / "control" / "controller.json"
    atomic_write_json(legacy, {"runs": 3, "history": [{"event": "run_started", "run": 3}]})
    kv = open_store()
    assert adopt_json(kv, "controller", legacy) == (1, {"runs": 3, "history": [{"event": "run_started", "run": 3}]})
    assert not legacy.exists() and legacy.with_name("controller.json.migrated").exists()

    kv.put("controller", {"runs": 4}, 1)
    atomic_write_json(legacy, {"runs": 1})  # an old release wrote the file again (a downgrade and back)
    assert adopt_json(open_store(), "controller", legacy) == (2, {"runs": 4})
    assert not legacy.exists()
    assert adopt_json(kv, "omls", tmp_path / "root" / "control" / "omls.json") is None


def test_postgresql_state_creates_no_sqlite_file(pg_dsn, tmp_path):
    from tests.servers import unique_namespace

    kv = control_store(tmp_path / "root", {"dsn": pg_dsn, "namespace": unique_namespace()})
    kv.put_latest("k", 1)
    kv.close()
    assert not (tmp_path / "root" / "control" / "control.db").exists()


def test_the_report_reads_the_controllers_history_from_the_store_or_an_older_releases_file(state_cfg, tmp_path):
    from cluster.controller_state import read_controller_state
    from cluster.report import load_windows
    from core.storage import StorageLayout

    layout = StorageLayout(tmp_path / "root")
    history = [{"event": "run_started", "at": 104.0, "run": 1}, {"event": "run_finished", "at": 107.0, "run": 1}]
    atomic_write_json(layout.control / "controller.json", {"history": history[:1]})
    assert [(s, e) for s, e, _ in load_windows(layout, state_cfg)] == [(104.0, None)]  # the older file
    assert not (layout.control / "control.db").exists()  # a reader creates no embedded store

    kv = control_store(layout.root, state_cfg)
    kv.put("controller", {"runs": 1, "history": history, "current": None}, 0)
    kv.close()
    assert [(s, e) for s, e, _ in load_windows(layout, state_cfg)] == [(104.0, 107.0)]  # the store wins
    assert read_controller_state(layout.root, state_cfg)["runs"] == 1


# ------------------------------------------------------------------------------ the OMLS actor's state


def _omls(root, state, monkeypatch):
    """An `OMLSActor` built inside a running event loop, as Ray builds it; its control loop cancelled
    (the test drives it). Ray's metrics need a Ray worker: stubbed."""
    import cluster.omls_actor as mod
    from core.config import SchedulerConfig

    class _NoMetrics:
        def observe(self, *a) -> None: ...

    monkeypatch.setattr(mod, "_Metrics", _NoMetrics)
    cfg = SchedulerConfig(sleep_start=None, sleep_end=None, idle_minutes=60, min_window_minutes=0)

    async def build():
        actor = mod.OMLSActor(cfg, str(root), state=state)
        actor._task.cancel()
        return actor

    return build


async def test_a_restarted_omls_finds_its_state_and_a_stale_incarnation_cannot_overwrite_it(
        state_cfg, tmp_path, monkeypatch):
    build = _omls(tmp_path / "root", state_cfg, monkeypatch)
    old = await build()
    await old.report_activity(time.time() + 3600)  # later than the actor's start: it counts
    assert [t["dst"] for t in await old.trigger_now()] == ["window_open"]
    last = (await old.state())["last_activity"]

    new = await build()  # the restarted actor
    st = await new.state()
    assert (st["state"], st["manual"], st["pending_actions"]) == ("window_open", True, 1)
    assert st["last_activity"] == last  # the inactivity timer survives the restart
    assert [a["action"] for a in await new.pending_actions()] == ["start_training"]

    with pytest.raises(Conflict):  # the old incarnation, still running somewhere, is fenced off
        await old.cancel_trigger()
    assert (await build()).actions == []  # the successor's state stands


async def test_omls_adopts_the_state_file_of_an_older_release(tmp_path, monkeypatch):
    await (await _omls(tmp_path / "a", None, monkeypatch)()).trigger_now()
    doc = control_store(tmp_path / "a").get("omls")[1]
    legacy = tmp_path / "b" / "control" / "omls.json"
    atomic_write_json(legacy, doc)  # what an older release left: the same document, in a file

    st = await (await _omls(tmp_path / "b", None, monkeypatch)()).state()
    assert (st["state"], st["pending_actions"]) == ("window_open", 1)
    assert not legacy.exists() and control_store(tmp_path / "b").get("omls") == (1, doc)
