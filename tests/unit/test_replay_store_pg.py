"""ReplayStore on PostgreSQL with several writers (issue 13): two stores on one namespace stand for two
processes (a second Replay after a failover, `clawray dlq`); the invariants proven under SQLite's single
writer hold because every write transaction takes the store lock. Real server (tests/servers.py)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from core.config import StateConfig
from core.contracts import Sample
from tests.servers import unique_namespace
from train import replay_store
from train.replay_store import ReplayStore


def make_sample(group: str | None = None, size: int = 1) -> Sample:
    return Sample(session_id="s", turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4],
                  response_logprobs=[-1.0, -1.0], reward=1.0, loss_mask=[1, 1], skill_generation=0,
                  group_id=group, group_size=size)


@pytest.fixture
def pg_state(pg_dsn) -> StateConfig:
    return StateConfig(dsn=pg_dsn, namespace=unique_namespace())


@pytest.fixture
def two_stores(pg_state, tmp_path: Path):
    stores = [ReplayStore(tmp_path / "unused.sqlite", default_lease_s=60, state=pg_state) for _ in range(2)]
    yield stores
    for s in stores:
        s.close()
    assert not (tmp_path / "unused.sqlite").exists()  # PostgreSQL: the SQLite path is never created


def wait_until(cond, what: str, timeout_s: float = 20.0) -> None:
    """Poll `cond` (a condition, not a guess at timing) until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.005)


def waits_for_the_store_lock(dsn: str) -> bool:
    """Whether some backend of the server is blocked on an advisory lock (the store lock) right now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' "
            "AND datname = current_database()").fetchone()[0] > 0


def test_two_stores_leasing_under_contention_take_disjoint_batches_and_lose_nothing(two_stores) -> None:
    """Four trainers on two stores lease, seal and commit while a fifth thread appends loose samples and
    GRPO groups: no sample is in two leases, every group is leased whole, every sample is trained once."""
    appended: list[Sample] = []
    leases: list[tuple[str, list[str]]] = []
    done_appending, record = threading.Event(), threading.Lock()
    start = threading.Barrier(5)

    def appender() -> None:
        start.wait()
        for _ in range(25):
            gid = uuid.uuid4().hex
            batch = [make_sample() for _ in range(5)] + [make_sample(gid, 3) for _ in range(3)]
            two_stores[0].append(batch)
            appended.extend(batch)
        done_appending.set()

    def trainer(store: ReplayStore) -> None:
        start.wait()
        while True:
            finished = done_appending.is_set()  # read BEFORE the lease: an empty lease after it is final
            lease_id, got = store.lease(7, min_size=1)
            if lease_id is None:
                if finished:
                    return
                continue
            ids = [s.sample_id for s in got]
            with record:
                leases.append((lease_id, ids))
            assert store.seal(lease_id, ids) == (True, "sealed")
            assert store.commit(lease_id) == len(ids)

    threads = [threading.Thread(target=appender)] + [
        threading.Thread(target=trainer, args=(two_stores[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    leased = [i for _, ids in leases for i in ids]
    assert len(leased) == len(set(leased)) == len(appended) == 200  # disjoint, and nothing left behind
    lease_of = {i: lid for lid, ids in leases for i in ids}
    for gid in {s.group_id for s in appended if s.group_id}:
        assert len({lease_of[s.sample_id] for s in appended if s.group_id == gid}) == 1  # whole
    st = two_stores[1].stats()
    assert st["by_state"]["trained"] == 200 and st["total"] == 200 and st["open_leases"] == 0


def test_a_seal_racing_begin_evolution_is_serialised_by_the_store_lock(two_stores, pg_dsn, monkeypatch) -> None:
    """The race the store lock exists for: a seal has checked its rows (all leased, no fence) when an
    evolution on another store claims one of them. The evolution must wait for the seal's commit and
    then find the sample sealed (unclaimable); without the lock it would claim a sample the step is
    about to train on (support AND sealed: the support/query split broken)."""
    trainer, evolver = two_stores
    batch = [make_sample() for _ in range(2)]
    trainer.append(batch)
    lease_id, got = trainer.lease(2)
    ids = [s.sample_id for s in got]
    claim: dict[str, tuple[str, list[str]]] = {}
    evolution = threading.Thread(target=lambda: claim.update(r=evolver.begin_evolution([ids[0]], ttl_s=60)))
    checked = replay_store._seal_refusal

    def checked_then_an_evolution_starts(t, lease, sample_ids):
        why = checked(t, lease, sample_ids)  # all still leased by this step, no fence pending ...
        evolution.start()  # ... now the evolution runs, and either waits for the lock or gets through
        wait_until(lambda: not evolution.is_alive() or waits_for_the_store_lock(pg_dsn),
                   "the evolution finished or waits for the store lock")
        return why

    monkeypatch.setattr(replay_store, "_seal_refusal", checked_then_an_evolution_starts)
    assert trainer.seal(lease_id, ids) == (True, "sealed")
    evolution.join(20)
    token, claimed = claim["r"]
    assert claimed == [] and trainer.states(ids) == {i: "sealed" for i in ids}
    assert evolver.end_evolution(token, 1, claimed)["found"]
    assert trainer.commit(lease_id) == 2 and set(trainer.states(ids).values()) == {"trained"}


def test_the_report_reads_rewards_from_the_postgresql_buffer(two_stores, pg_state, tmp_path: Path) -> None:
    """`clawray report` with `state.dsn`: the rewards come from the shared buffer, not a local file."""
    from cluster.report import load_rewards
    from core.storage import StorageLayout

    store = two_stores[0]
    store.append([make_sample(), make_sample().model_copy(update={"sample_id": "b", "reward": -1.0})])
    rewards = load_rewards(StorageLayout(tmp_path), pg_state.model_dump())
    assert sorted(r["reward"] for r in rewards) == [-1.0, 1.0] and {r["state"] for r in rewards} == {"fresh"}
