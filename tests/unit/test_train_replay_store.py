"""ReplayStore: generation filtering, leases, commit, O(batch) leasing, durability across kill -9.

Every contract test runs on both backends (the `state_cfg` fixture: SQLite, and a fresh namespace in a
real PostgreSQL server); tests/unit/test_replay_store_pg.py has the multi-process PostgreSQL ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core.contracts import Sample
from train.replay_store import ReplayStore

REPO = Path(__file__).resolve().parents[2]


def make_sample(gen: int = 0, reward: float = 1.0, mask: list[int] | None = None, **kw) -> Sample:
    mask = [1, 1, 1] if mask is None else mask
    return Sample(
        session_id=kw.pop("session_id", "s"),
        turn_index=kw.pop("turn_index", 0),
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5, 6][: len(mask)],
        response_logprobs=[-1.0, -2.0, -3.0][: len(mask)],
        reward=reward,
        loss_mask=mask,
        skill_generation=gen,
        **kw,
    )


@pytest.fixture()
def store(tmp_path: Path, state_cfg) -> ReplayStore:
    s = ReplayStore(tmp_path / "replay.sqlite", default_lease_s=60, state=state_cfg)
    yield s
    s.close()


def test_append_is_idempotent_and_masked_samples_are_audit_only(store: ReplayStore) -> None:
    a, masked = make_sample(), make_sample(mask=[0, 0, 0])
    assert store.append([a, masked]) == 2
    assert store.append([a]) == 0  # a re-sent sample is not duplicated
    assert store.append([]) == 0
    assert store.states([a.sample_id, masked.sample_id]) == {a.sample_id: "fresh", masked.sample_id: "masked"}
    lease_id, got = store.lease(10)
    assert [s.sample_id for s in got] == [a.sample_id]
    assert got[0] == a  # token ids and engine logprobs come back exactly as stored


def test_lease_returns_only_current_generation_and_bump_retires_older(store: ReplayStore) -> None:
    old = [make_sample(gen=0) for _ in range(3)]
    store.append(old)
    assert store.set_generation(1) == 3
    assert store.set_generation(0) == 0  # the generation never moves back
    new = [make_sample(gen=1) for _ in range(2)]
    late_old = make_sample(gen=0)  # a stale turn that arrives after the bump
    store.append(new + [late_old])
    _, got = store.lease(10)
    assert {s.sample_id for s in got} == {s.sample_id for s in new}
    st = store.stats()
    assert st["generation"] == 1
    assert st["by_state"]["retired"] == 4
    assert st["by_generation"]["0"] == {"retired": 4}


def test_appending_a_newer_generation_advances_and_retires(store: ReplayStore) -> None:
    old = make_sample(gen=0)
    store.append([old])
    store.append([make_sample(gen=2)])
    assert store.generation == 2
    assert store.states([old.sample_id]) == {old.sample_id: "retired"}


def test_commit_marks_trained_and_is_idempotent(store: ReplayStore) -> None:
    samples = [make_sample() for _ in range(4)]
    store.append(samples)
    lease_id, got = store.lease(3)
    assert len(got) == 3 and [s.sample_id for s in got] == [s.sample_id for s in samples[:3]]  # oldest first
    assert store.seal(lease_id, [s.sample_id for s in got]) == (True, "sealed")
    assert store.commit(lease_id) == 3
    assert store.commit(lease_id) == 0
    _, rest = store.lease(10)
    assert [s.sample_id for s in rest] == [samples[3].sample_id]
    assert store.stats()["by_state"]["trained"] == 3


def test_expired_lease_is_redelivered_and_retired_if_generation_moved(store: ReplayStore) -> None:
    a, b = make_sample(gen=0), make_sample(gen=0)
    store.append([a])
    lease_id, _ = store.lease(5, lease_s=-1)  # already expired
    lease2, again = store.lease(5)  # lease() first returns expired leases
    assert [s.sample_id for s in again] == [a.sample_id]
    assert store.seal(lease_id, [a.sample_id])[0] is False  # the stale lease can no longer seal ...
    assert store.commit(lease_id) == 0  # ... nor commit
    store.append([b])
    store.lease(5, lease_s=-1)  # leases b, already expired
    store.set_generation(1)
    assert store.release_expired() == 1
    assert store.states([b.sample_id]) == {b.sample_id: "retired"}
    # Leased under generation 0, the bump came before the step's commit point: never trained (issue 12
    # item 1; this test used to assert that the lease still committed as trained).
    ok, why = store.seal(lease2, [a.sample_id])
    assert not ok and "generation 0" in why
    assert store.release(lease2) == 1 and store.commit(lease2) == 0
    assert store.states([a.sample_id]) == {a.sample_id: "retired"}


def test_release_owner_and_min_size(store: ReplayStore) -> None:
    store.append([make_sample() for _ in range(3)])
    assert store.lease(5, min_size=4) == (None, [])
    lease_id, got = store.lease(2, owner="run-a")
    assert store.stats()["open_leases"] == 1
    assert store.release_owner("run-b") == 0
    assert store.release_owner("run-a") == 2
    assert store.stats()["by_state"]["fresh"] == 3 and store.stats()["open_leases"] == 0


def test_support_samples_are_never_leased(store: ReplayStore) -> None:
    a, b = make_sample(turn_id="t-a"), make_sample()
    store.append([a, b])
    assert store.mark_support(["t-a"]) == 1  # by turn id
    assert store.mark_support([b.sample_id]) == 1  # by sample id
    assert store.lease(5) == (None, [])
    assert store.stats()["by_state"]["support"] == 2


def test_dead_letters_list_requeue_drop_and_count(store: ReplayStore) -> None:
    a, b, masked = make_sample(), make_sample(), make_sample(mask=[0, 0, 0])
    store.append([a, b, masked])
    lease_id, got = store.lease(5)
    assert store.dead_letter([a.sample_id, masked.sample_id, "nope"], "empty response") == 2
    assert store.dead_letter([a.sample_id], "still empty") == 1  # dead -> dead counts a second attempt
    letters = store.dead_letters()
    assert [(d["id"], d["error"], d["attempts"]) for d in letters] == [
        (masked.sample_id, "empty response", 1), (a.sample_id, "still empty", 2)]
    st = store.stats()
    assert st["dead_letters"] == 2 and st["by_state"]["dead"] == 2
    assert store.seal(lease_id, [s.sample_id for s in got])[0] is False  # a left the lease
    assert store.seal(lease_id, [b.sample_id])[0] and store.commit(lease_id) == 1
    assert store.requeue([a.sample_id, masked.sample_id, b.sample_id]) == 2  # b is not dead
    assert store.states([a.sample_id, masked.sample_id]) == {a.sample_id: "fresh", masked.sample_id: "masked"}
    store.dead_letter([a.sample_id], "again")
    assert store.dead_letters()[0]["attempts"] == 3
    assert store.drop([a.sample_id, b.sample_id]) == 1
    assert store.states([a.sample_id]) == {} and store.dead_letters() == []


def test_a_stored_row_that_no_longer_parses_is_dead_lettered_not_leased_forever(store: ReplayStore) -> None:
    good, bad = make_sample(), make_sample()
    store.append([bad, good])
    with store._db.tx() as c:
        c.execute("UPDATE samples SET payload = '{\"broken\": 1}' WHERE sample_id = ?", (bad.sample_id,))
    _, got = store.lease(5)
    assert [s.sample_id for s in got] == [good.sample_id]
    assert store.states([bad.sample_id]) == {bad.sample_id: "dead"}
    assert "does not parse" in store.dead_letters()[0]["error"]


def test_a_buffer_from_before_groups_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE samples (seq INTEGER PRIMARY KEY AUTOINCREMENT, sample_id TEXT NOT NULL UNIQUE, "
                "turn_id TEXT, state TEXT NOT NULL, generation INTEGER NOT NULL, created_at REAL NOT NULL, "
                "updated_at REAL NOT NULL, lease_id TEXT, lease_expires REAL, payload TEXT NOT NULL)")
    old = make_sample()
    con.execute("INSERT INTO samples(sample_id, state, generation, created_at, updated_at, payload) "
                "VALUES(?, 'fresh', 0, 0, 0, ?)", (old.sample_id, old.model_dump_json()))
    con.commit()
    con.close()
    s = ReplayStore(path)
    _, got = s.lease(5)
    assert [x.sample_id for x in got] == [old.sample_id]
    s.close()


def test_lease_uses_the_state_index_not_a_scan(store: ReplayStore) -> None:
    store.append([make_sample(gen=g) for g in (0, 1, 1)])
    plan = store.explain_lease()
    if store._db.dialect == "sqlite":
        assert "SEARCH samples USING INDEX ix_state_gen (state=? AND generation=?)" in plan, plan
        assert "SCAN samples" not in plan and "TEMP B-TREE" not in plan, plan
    else:  # the partial index hands the oldest fresh rows of the generation over in seq order
        assert "Index Scan using ix_fresh_seq on samples" in plan and "LockRows" in plan, plan
        assert "Sort" not in plan and "Seq Scan" not in plan, plan


def test_every_write_obeys_the_generation_another_process_committed(tmp_path: Path, state_cfg) -> None:
    """Two stores on one buffer (the Replay actor and `clawray dlq`, or a second Replay after a
    failover): a generation one of them committed governs the other's next write, never a cached copy."""
    a = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    b = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    a.append([make_sample(gen=0)])  # a has seen generation 0
    assert b.set_generation(1) == 1
    late = make_sample(gen=0)  # served under generation 0, arrives after the bump
    assert a.append([late]) == 1
    assert a.states([late.sample_id]) == {late.sample_id: "retired"}
    assert a.lease(5) == (None, []) and a.generation == 1 and a.stats()["generation"] == 1
    current = make_sample(gen=1)
    a.append([current])
    lease_id, _ = a.lease(5)
    assert b.set_generation(2) == 0  # nothing fresh to retire: `current` is leased
    assert a.seal(lease_id, [current.sample_id]) == (
        False, f"sample {current.sample_id} was served under generation 1, now 2")
    a.close()
    b.close()


def test_oldest_fresh_age(store: ReplayStore) -> None:
    assert store.stats()["oldest_fresh_age_s"] is None
    store.append([make_sample(created_at=time.time() - 100)])
    assert store.stats()["oldest_fresh_age_s"] >= 99


def test_survives_restart(tmp_path: Path, state_cfg) -> None:
    s = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    s.append([make_sample(gen=3)])
    lease_id, got = s.lease(1)
    s.close()
    s2 = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    assert s2.generation == 3
    assert s2.seal(lease_id, [x.sample_id for x in got])[0] and s2.commit(lease_id) == 1
    s2.close()


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from core.contracts import Sample
    from train.replay_store import ReplayStore
    store = ReplayStore({path!r}, state={state!r})
    i = 0
    while True:
        batch = [Sample(sample_id=f"s{{i}}-{{k}}", session_id="x", turn_index=0, prompt_ids=[1],
                        response_ids=[2], response_logprobs=[-1.0], reward=1.0, loss_mask=[1],
                        skill_generation=0) for k in range(3)]
        store.append(batch)
        print(" ".join(s.sample_id for s in batch), flush=True)  # acknowledged only after append returned
        i += 1
    """
)


def test_acknowledged_samples_survive_kill_9(tmp_path: Path, state_cfg) -> None:
    path = tmp_path / "kill.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(repo=str(REPO), path=str(path), state=state_cfg.model_dump())],
        stdout=subprocess.PIPE, text=True,
    )
    acked: list[str] = []
    try:
        while len(acked) < 60:
            line = proc.stdout.readline()
            assert line, "writer died early"
            acked += line.split()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    store = ReplayStore(path, state=state_cfg)
    states = store.states(acked)
    store.close()
    assert len(states) == len(acked) and set(states.values()) == {"fresh"}
