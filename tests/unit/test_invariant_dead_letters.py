"""Invariant (issue 12 item 7): poison items don't loop forever, and no failure is counted twice.

- A turn whose scoring fails because of the turn itself `max_delivery_attempts` times leaves the outbox as
  a dead letter with its last error; a scorer outage never counts; `requeue` puts it back.
- `clawray dlq list | requeue | drop` over both dead-letter stores (session outbox and replay buffer).
- The Evolver observes a turn once, however often the outbox re-delivers it to the PRM.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.config import EvolverConfig, RewardsConfig, SkillsConfig
from core.contracts import Sample, Turn
from evolve.bank import SkillBank
from evolve.evolvers import FeedbackEvolver
from evolve.loop import EvolutionLoop
from serve.outbox import DeliveryFailed, Dispatcher, SinkUnreachable
from serve.sessions import SessionStore


def _turn(sid: str, **kw) -> Turn:
    return Turn(session_id=sid, turn_index=0, prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-1.0],
                last_in_session=True, **kw)


class PoisonSink:
    """Takes every turn except those of session `poison`, which make the scorer raise."""

    def __init__(self, error: Exception):
        self.error, self.sent, self.taken = error, [], []

    async def submit(self, turns):
        self.sent += [t.turn_id for t in turns]
        bad = {t.turn_id: self.error for t in turns if t.session_id == "poison"}
        self.taken += [t.turn_id for t in turns if t.turn_id not in bad]
        if bad:
            raise DeliveryFailed(bad)


def _drain(d: Dispatcher, times: int) -> None:
    async def run():
        for _ in range(times):
            await d.drain_once()

    asyncio.run(run())


def test_a_turn_that_fails_scoring_n_times_becomes_a_dead_letter_and_is_never_resent(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    (bad,) = store.record([_turn("poison")])
    (good,) = store.record([_turn("fine")])
    sink = PoisonSink(ValueError("checker crashed on this turn"))
    d = Dispatcher(store, sink, idle_s=3600, retry_s=0, max_failures=3)
    _drain(d, 8)
    assert sink.sent.count(bad.turn_id) == 3  # tried max_delivery_attempts times, then never again
    assert sink.taken == [good.turn_id]  # the healthy turn of the same batch went through once
    (dead,) = store.dead_letters()
    assert dead["id"] == bad.turn_id and "checker crashed on this turn" in dead["error"]
    assert d.dead_lettered == 1 and store.stats()["dead"] == 1
    assert store.requeue([bad.turn_id, "no-such-id"]) == 1  # back into the outbox, failure count reset
    _drain(d, 1)
    assert sink.sent.count(bad.turn_id) == 4 and store.dead_letters() == []
    assert store.prune(older_than_s=0) == 1  # dead letters are never pruned (only the dispatched turn)
    _drain(d, 2)
    assert [x["id"] for x in store.dead_letters()] == [bad.turn_id]
    assert store.drop([bad.turn_id]) == 1 and store.turns("poison") == []


@pytest.mark.parametrize("outage", [SinkUnreachable("no PRM actor"), type("JudgeDown", (RuntimeError,),
                                                                          {"retryable": True})("judge 503")])
def test_a_scorer_outage_never_counts_towards_the_dead_letters(tmp_path, outage):
    store = SessionStore(tmp_path / "s.db")
    (t,) = store.record([_turn("poison")])
    sink = PoisonSink(outage)
    d = Dispatcher(store, sink, idle_s=3600, retry_s=0, max_failures=2)
    _drain(d, 6)
    assert sink.sent.count(t.turn_id) == 6 and store.dead_letters() == []  # retried, kept, never dead
    assert d.dead_lettered == 0


def test_a_whole_batch_failing_outside_the_sink_protocol_counts_for_every_turn(tmp_path):
    store = SessionStore(tmp_path / "s.db")
    ids = [store.record([_turn(f"s{i}")])[0].turn_id for i in range(2)]

    class Broken:
        async def submit(self, turns):
            raise TypeError("cannot serialise this batch")

    d = Dispatcher(store, Broken(), idle_s=3600, retry_s=0, max_failures=2)
    _drain(d, 3)
    assert sorted(x["id"] for x in store.dead_letters()) == sorted(ids)


# ---- the Evolver counts a re-delivered turn once ----------------------------------------------------

def _loop(tmp_path: Path) -> EvolutionLoop:
    return EvolutionLoop(SkillBank(tmp_path, SkillsConfig()), EvolverConfig(failure_rate_threshold=1.0),
                         FeedbackEvolver())


async def test_a_turn_scored_twice_is_observed_once(tmp_path):
    """The outbox re-delivers a turn whose acknowledgement was lost; the PRM stores it once (sample_id ==
    turn_id) and notifies again after the store (so a crash before notifying loses nothing): the loop
    must count it once."""
    from rewards.prm import PRM

    loop = _loop(tmp_path)

    class Sink:
        def __init__(self):
            self.ids: set[str] = set()

        async def append(self, samples):
            self.ids |= {s.sample_id for s in samples}

    class Notifier:
        def __init__(self):
            self.calls, self.tasks = 0, []

        def notify(self, turn, sample):
            self.calls += 1
            self.tasks.append(asyncio.ensure_future(loop.observe(turn, sample)))
            return True

    prm = PRM(RewardsConfig(votes=1, judge_source="none"), Sink)
    prm.evolver = Notifier()
    turn = Turn(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                messages=[{"role": "user", "content": "say hi in lowercase"}], response_text="HI",
                next_state=[{"role": "user", "content": "not lowercase"}],
                eval_spec={"type": "lowercase"})
    first = await prm.score(turn)
    again = await prm.score(turn)  # the outbox's re-delivery
    await asyncio.gather(*prm.evolver.tasks)
    assert first.sample_id == again.sample_id == turn.turn_id and prm.sink.ids == {turn.turn_id}
    assert prm.evolver.calls == 2  # notified after every successful store
    assert loop.counters["turns_observed"] == 1 and loop.pending() == {"s": 1}


async def test_the_observed_ids_memory_is_bounded(tmp_path, monkeypatch):
    import evolve.loop as loop_module

    monkeypatch.setattr(loop_module, "MAX_OBSERVED_IDS", 3)
    loop = _loop(tmp_path)
    pairs = []
    for i in range(5):
        t = Turn(session_id=f"s{i}", turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0])
        pairs.append((t, Sample.from_turn(t, reward=1.0, trainable=True)))
    for t, s in pairs + pairs[-3:]:
        await loop.observe(t, s)
    assert loop.counters["turns_observed"] == 5  # the last three were remembered
    await loop.observe(*pairs[0])  # forgotten (oldest first): counted again, at worst, never lost
    assert loop.counters["turns_observed"] == 6


# ---- clawray dlq ------------------------------------------------------------------------------------

def test_the_dlq_cli_lists_requeues_and_drops_over_both_stores(tmp_path, monkeypatch, state_cfg):
    """On both backends: the CLI opens the stores through the config's `state` (env overrides here)."""
    import json

    from typer.testing import CliRunner

    from cluster.cli import CLIError, app
    from core.storage import StorageLayout
    from serve.sessions import DB_FILE as SESSIONS_DB
    from train.replay import DB_FILE as REPLAY_DB
    from train.replay_store import ReplayStore

    monkeypatch.setenv("CLAWRAY__STORAGE_ROOT", str(tmp_path))
    if state_cfg.dsn:
        monkeypatch.setenv("CLAWRAY__STATE__DSN", state_cfg.dsn)
        monkeypatch.setenv("CLAWRAY__STATE__NAMESPACE", state_cfg.namespace)
    state = state_cfg.model_dump()
    layout = StorageLayout(tmp_path).ensure()
    runner = CliRunner()
    assert "no dead letters" in runner.invoke(app, ["dlq", "list"]).output  # no store files yet: none made
    assert not (layout.sessions / SESSIONS_DB).exists()

    outbox = SessionStore(layout.sessions / SESSIONS_DB, state)
    turns = [outbox.record([_turn(f"p{i}")])[0] for i in range(2)]
    outbox.claim(10, 60)
    assert outbox.fail([t.turn_id for t in turns], "ValueError: bad turn", 0, max_failures=1) == 2
    replay = ReplayStore(layout.replay / REPLAY_DB, state=state)
    sample = Sample.from_turn(_turn("r"), reward=1.0, trainable=True)
    replay.append([sample])
    assert replay.dead_letter([sample.sample_id], "collate: empty response") == 1

    listed = json.loads(runner.invoke(app, ["dlq", "list", "--json"]).output)
    assert sorted((r["store"], r["id"]) for r in listed) == sorted(
        [("outbox", turns[0].turn_id), ("outbox", turns[1].turn_id), ("replay", sample.sample_id)])
    assert {r["error"] for r in listed} == {"ValueError: bad turn", "collate: empty response"}

    bad = runner.invoke(app, ["dlq", "requeue", turns[0].turn_id, "no-such-id"])
    assert isinstance(bad.exception, CLIError) and "no-such-id" in str(bad.exception)
    assert len(outbox.dead_letters()) == 2  # refused as a whole: nothing changed

    ok = runner.invoke(app, ["dlq", "requeue", turns[0].turn_id, sample.sample_id])
    assert ok.exit_code == 0, ok.output
    assert [t.turn_id for t in outbox.claim(10, 60)] == [turns[0].turn_id]  # back in the outbox
    assert replay.dead_letters() == [] and replay.states([sample.sample_id]) == {sample.sample_id: "fresh"}

    assert runner.invoke(app, ["dlq", "drop", turns[1].turn_id]).exit_code == 0
    assert outbox.dead_letters() == [] and outbox.turns("p1") == []
    assert "no dead letters" in runner.invoke(app, ["dlq", "list"]).output
    outbox.close()
    replay.close()


def test_dead_letters_are_counted_by_a_proxy_metric(monkeypatch):
    import ray.util.metrics as ray_metrics

    from serve.metrics import ProxyMetrics

    incs: dict[str, float] = {}

    class Metric:
        def __init__(self, name, *args, **kwargs):
            self.name = name

        def inc(self, n=1.0, tags=None):
            incs[self.name] = incs.get(self.name, 0) + n

        def observe(self, value, tags=None):
            pass

        def _record(self, value, tags=None):  # core.metrics.zero_counter: the series exists at 0 from the start
            assert value == 0

    monkeypatch.setattr(ray_metrics, "Counter", Metric)
    monkeypatch.setattr(ray_metrics, "Histogram", Metric)
    m = ProxyMetrics()
    m.dead_letters(2)  # the dispatcher's running total, read once a second
    m.dead_letters(2)
    m.flush()
    m.dead_letters(3)
    m.flush()
    assert incs == {"clawray_proxy_dead_letters_total": 3}
