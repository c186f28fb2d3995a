"""Support/query separation under overlap (issue 12 item 1) and a monotonic generation (part of item 9).

Every interleaving of a training step (lease -> gradients -> seal -> update -> commit) with an evolution
(begin_evolution -> evolver -> bank write -> end_evolution) on the ReplayStore, driven call by call; the
evolution loop's ordering against a recording replay; the bank and Replay generations never go back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import EvolverConfig, SkillsConfig
from core.contracts import Sample, Turn
from evolve.bank import SkillBank
from evolve.evolvers import FeedbackEvolver
from evolve.loop import EvolutionLoop, fence_ttl_s
from train.replay_store import ReplayStore

FEEDBACK = "[Previous Feedback] You must create config.json.bak before modifying config.json."


def make_sample(gen: int = 0, mask: list[int] | None = None, **kw) -> Sample:
    mask = [1, 1] if mask is None else mask
    return Sample(session_id="s", turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4],
                  response_logprobs=[-1.0, -1.0], reward=kw.pop("reward", 1.0), loss_mask=mask,
                  skill_generation=gen, **kw)


@pytest.fixture()
def store(tmp_path: Path, state_cfg) -> ReplayStore:
    """On both backends (SQLite, and a fresh namespace in a real PostgreSQL server)."""
    s = ReplayStore(tmp_path / "replay.sqlite", default_lease_s=60, state=state_cfg)
    yield s
    s.close()


def ids(samples) -> list[str]:
    return [s.sample_id for s in samples]


# ------------------------------------------------------------------------------------------ the store
def test_support_claimed_from_a_leased_batch_makes_its_seal_fail(store: ReplayStore) -> None:
    batch = [make_sample() for _ in range(4)]
    store.append(batch)
    lease_id, got = store.lease(4)
    token, claimed = store.begin_evolution([batch[1].sample_id], ttl_s=60)  # lease -> fence
    assert claimed == [batch[1].sample_id]
    ok, why = store.seal(lease_id, ids(got))  # fence pending -> refused
    assert not ok and "evolution" in why
    store.end_evolution(token, 1, [])  # S changed: generation 1, the claimed sample stays support
    ok, why = store.seal(lease_id, ids(got))
    assert not ok and "support" in why
    assert store.release(lease_id) == 3 and store.commit(lease_id) == 0
    assert store.stats()["open_leases"] == 0
    assert store.states(ids(batch)) == {batch[1].sample_id: "support",
                                        **{s.sample_id: "retired" for s in batch if s is not batch[1]}}


def test_a_pending_fence_refuses_every_seal_until_it_ends(store: ReplayStore) -> None:
    batch, other = [make_sample() for _ in range(2)], make_sample()
    store.append(batch + [other])
    lease_id, got = store.lease(2)
    token, claimed = store.begin_evolution([other.sample_id], ttl_s=60)  # not in the lease
    assert store.seal(lease_id, ids(got))[0] is False
    assert store.stats()["pending_fences"] == 1
    assert store.end_evolution(token, None, claimed) == {"retired": 0, "released": 1, "found": True}
    assert store.seal(lease_id, ids(got)) == (True, "sealed")  # nothing changed: the step may commit
    assert store.commit(lease_id) == 2
    assert store.states([other.sample_id]) == {other.sample_id: "fresh"}


def test_sealed_samples_cannot_become_support(store: ReplayStore) -> None:
    batch = [make_sample() for _ in range(3)]
    store.append(batch)
    lease_id, got = store.lease(3)
    assert store.seal(lease_id, ids(got))[0]  # seal -> fence
    token, claimed = store.begin_evolution(ids(batch), ttl_s=60)
    assert claimed == []  # the evolution must leave them out
    assert store.mark_support(ids(batch)) == 0
    store.end_evolution(token, 1, [])
    assert store.release_expired(now=1e12) == 0  # sealed samples never expire
    assert store.commit(lease_id) == 3 and set(store.states(ids(batch)).values()) == {"trained"}


def test_a_bump_between_lease_and_seal_discards_the_step(store: ReplayStore) -> None:
    batch = [make_sample(gen=0) for _ in range(2)]
    store.append(batch)
    lease_id, got = store.lease(2)
    store.append([make_sample(gen=1)])  # a turn served under generation 1 proves it exists
    ok, why = store.seal(lease_id, ids(got))
    assert not ok and "generation 0" in why
    assert store.release(lease_id) == 2 and set(store.states(ids(batch)).values()) == {"retired"}


def test_an_expired_fence_stops_counting(store: ReplayStore) -> None:
    store.append([make_sample()])
    lease_id, got = store.lease(1)
    store.begin_evolution([], ttl_s=0.0)  # an evolver that died: its fence expired at once
    assert store.stats()["pending_fences"] == 0
    assert store.seal(lease_id, ids(got)) == (True, "sealed")


def test_end_evolution_releases_only_what_this_fence_claimed(store: ReplayStore) -> None:
    a, b = make_sample(), make_sample()
    masked, stale = make_sample(mask=[0, 0]), make_sample()
    store.append([a, b, masked, stale])
    t1, c1 = store.begin_evolution([a.sample_id], ttl_s=60)
    store.end_evolution(t1, None, [])  # a stays support (an earlier, accepted evolution)
    t2, c2 = store.begin_evolution([a.sample_id, b.sample_id, masked.sample_id, "unknown"], ttl_s=60)
    assert c2 == [a.sample_id, b.sample_id, masked.sample_id]
    out = store.end_evolution(t2, None, c2)
    assert out["released"] == 2
    assert store.states([a.sample_id, b.sample_id, masked.sample_id]) == {
        a.sample_id: "support", b.sample_id: "fresh", masked.sample_id: "masked"}
    # Released in the same transaction that advances the generation: stale -> retired.
    t3, c3 = store.begin_evolution([stale.sample_id], ttl_s=60)
    assert store.end_evolution(t3, 5, c3)["released"] == 1
    assert store.states([stale.sample_id]) == {stale.sample_id: "retired"}
    assert store.end_evolution("no-such-fence", None, [a.sample_id])["found"] is False
    assert store.states([a.sample_id]) == {a.sample_id: "support"}


def test_a_leased_support_claim_is_lost_by_the_lease_and_the_rest_train_later(store: ReplayStore) -> None:
    batch = [make_sample() for _ in range(3)]
    store.append(batch)
    lease_id, got = store.lease(3)
    token, claimed = store.begin_evolution([batch[0].sample_id], ttl_s=60)
    store.end_evolution(token, None, claimed)  # e.g. only merges: the claim is handed back
    assert store.seal(lease_id, ids(got))[0] is False  # batch[0] left the lease meanwhile
    assert store.release(lease_id) == 2
    lease2, again = store.lease(3)
    assert sorted(ids(again)) == sorted(ids(batch))  # all three valid: trained by the next step
    assert store.seal(lease2, ids(again))[0] and store.commit(lease2) == 3


def test_recovery_commits_the_checkpointed_lease_and_releases_the_rest(store: ReplayStore) -> None:
    batch = [make_sample() for _ in range(4)]
    store.append(batch)
    l1, g1 = store.lease(2, owner="run")
    assert store.seal(l1, ids(g1))[0]  # checkpointed
    l2, g2 = store.lease(2, owner="run")
    assert store.seal(l2, ids(g2))[0]  # sealed, then the run crashed before its checkpoint
    assert store.commit(l1) == 2
    assert store.release_owner("run") == 2
    assert store.states(ids(g2)) == {i: "fresh" for i in ids(g2)}


# ------------------------------------------------------------------------------------------ the loop
class OrderedReplay:
    """Records what the bank's generation was on disk when the replay was told each thing."""

    def __init__(self, bank_root: Path, store: ReplayStore | None = None):
        self.root, self.store, self.events = bank_root, store, []

    def _bank_gen(self) -> int:
        return SkillBank(self.root, SkillsConfig()).generation

    async def begin_evolution(self, sample_ids, ttl_s):
        self.events.append(("begin", self._bank_gen(), list(sample_ids)))
        if self.store is None:
            return "t", list(sample_ids)
        return self.store.begin_evolution(sample_ids, ttl_s)

    async def end_evolution(self, token, generation, release_ids):
        self.events.append(("end", self._bank_gen(), generation, list(release_ids)))
        if self.store is not None:
            self.store.end_evolution(token, generation, release_ids)

    # The protocol before issue 12 (kept here so the test shows the old order failing, not a TypeError).
    async def mark_support(self, sample_ids):
        self.events.append(("begin", self._bank_gen(), list(sample_ids)))

    async def set_generation(self, generation):
        self.events.append(("end", self._bank_gen(), generation, []))


def failing(i: int, session: str = "s1") -> tuple[Turn, Sample]:
    turn = Turn(session_id=session, turn_index=i, prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-1.0],
                messages=[{"role": "user", "content": "Please modify config.json to set debug=true"}],
                response_text="Done.", next_state=[{"role": "user", "content": FEEDBACK}])
    return turn, Sample.from_turn(turn, reward=-1.0, trainable=True)


async def test_support_is_claimed_before_the_bank_bumps_the_generation(tmp_path: Path) -> None:
    replay = OrderedReplay(tmp_path)
    loop = EvolutionLoop(SkillBank(tmp_path, SkillsConfig()), EvolverConfig(), FeedbackEvolver(), replay)
    turn, sample = failing(0)
    report = await loop.observe(turn, sample)
    assert report.generation == 1
    assert replay.events[0] == ("begin", 0, [sample.sample_id])  # claimed while S was still generation 0
    assert replay.events[1] == ("end", 1, 1, [])


async def test_failures_that_were_already_trained_are_left_out_of_the_evolution(tmp_path: Path, state_cfg) -> None:
    store = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    (t0, s0), (t1, s1) = failing(0, "a"), failing(1, "b")
    store.append([s0, s1])
    lease_id, got = store.lease(1)
    assert store.seal(lease_id, ids(got))[0] and store.commit(lease_id) == 1  # s0 trained
    seen: list[list[str]] = []

    class Spy(FeedbackEvolver):
        async def evolve(self, failures, existing):
            seen.append([f.sample_id for f in failures])
            return await super().evolve(failures, existing)

    loop = EvolutionLoop(SkillBank(tmp_path / "skills", SkillsConfig()), EvolverConfig(min_failures=1,
                         failure_rate_threshold=1.0, on_session_end=False), Spy(),
                         OrderedReplay(tmp_path / "skills", store))
    await loop.observe(t0, s0)
    await loop.observe(t1, s1)
    report = await loop.evolve_now()
    assert seen == [[s1.sample_id]] and report.failures == 1
    assert store.states([s0.sample_id, s1.sample_id]) == {s0.sample_id: "trained", s1.sample_id: "support"}
    assert store.generation == 1 and store.stats()["pending_fences"] == 0
    store.close()


async def test_an_evolution_that_changes_nothing_hands_its_claims_back(tmp_path: Path, state_cfg) -> None:
    store = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    (t0, s0), (t1, s1) = failing(0, "a"), failing(1, "b")
    store.append([s0, s1])
    loop = EvolutionLoop(SkillBank(tmp_path / "skills", SkillsConfig()), EvolverConfig(), FeedbackEvolver(),
                         OrderedReplay(tmp_path / "skills", store))
    first = await loop.observe(t0, s0)  # creates the skill: s0 is support, generation 1
    second = await loop.observe(t1, s1)  # the same lesson again: merged, no new generation
    assert first.accepted and second.merged and not second.accepted
    assert store.states([s0.sample_id, s1.sample_id]) == {s0.sample_id: "support", s1.sample_id: "retired"}
    assert store.stats()["pending_fences"] == 0
    store.close()


async def test_an_evolver_slower_than_the_fence_is_rejected_and_writes_nothing(tmp_path: Path, state_cfg) -> None:
    store = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    turn, sample = failing(0)
    store.append([sample])

    class Slow(FeedbackEvolver):
        async def evolve(self, failures, existing):
            import asyncio

            await asyncio.Event().wait()  # never returns: only the fence budget ends it

    loop = EvolutionLoop(SkillBank(tmp_path / "skills", SkillsConfig()), EvolverConfig(), Slow(),
                         OrderedReplay(tmp_path / "skills", store), fence_ttl=0.05)
    report = await loop.observe(turn, sample)
    assert report.error and "fence" in report.error and loop.bank.generation == 0
    assert store.states([sample.sample_id]) == {sample.sample_id: "fresh"}  # handed back
    assert store.stats()["pending_fences"] == 0
    store.close()


def test_fence_ttl_covers_the_llm_evolvers_retries() -> None:
    from core.config import LLMEndpoint

    assert fence_ttl_s(EvolverConfig()) >= 60
    llm = EvolverConfig(kind="llm", llm=LLMEndpoint(base_url="http://x/v1", model="m", timeout_s=60, max_retries=3))
    assert fence_ttl_s(llm) > 4 * 60


# ------------------------------------------------------------------------------ monotonic generation
def wipe(root: Path) -> None:
    import shutil

    for p in root.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


async def test_a_reader_never_reports_a_lower_generation_after_the_folder_is_wiped(tmp_path: Path) -> None:
    writer = EvolutionLoop(SkillBank(tmp_path, SkillsConfig()), EvolverConfig(), FeedbackEvolver())
    await writer.observe(*failing(0))
    reader = SkillBank(tmp_path, SkillsConfig())
    assert reader.generation == 1
    wipe(tmp_path)
    reader.reload()
    assert reader.generation == 1 and reader.disk_generation == 0 and len(reader) == 0


async def test_a_wiped_skills_folder_is_written_up_to_a_new_generation(tmp_path: Path) -> None:
    loop = EvolutionLoop(SkillBank(tmp_path, SkillsConfig()), EvolverConfig(), FeedbackEvolver())
    await loop.observe(*failing(0))
    assert loop.bank.generation == 1
    wipe(tmp_path)
    assert loop.reconcile() == 2  # the Evolver noticed the folder went back: a new generation
    assert SkillBank(tmp_path, SkillsConfig()).generation == 2  # what a freshly started Proxy reads
    assert loop.bank.history()[-1]["action"] == "reconcile"
    assert loop.reconcile() == 2  # idempotent


def test_a_fresh_evolver_on_a_wiped_folder_is_reconciled_above_replays_generation(tmp_path: Path, state_cfg) -> None:
    store = ReplayStore(tmp_path / "r.sqlite", state=state_cfg)
    store.append([make_sample(gen=3)])
    loop = EvolutionLoop(SkillBank(tmp_path / "skills", SkillsConfig()), EvolverConfig(), FeedbackEvolver())
    assert loop.bank.generation == 0  # a wiped (or new) folder, Replay already at 3
    generation = loop.reconcile(store.generation)  # what start_system does before set_generation
    assert generation == 4
    store.set_generation(generation)
    served = make_sample(gen=SkillBank(tmp_path / "skills", SkillsConfig()).generation)
    store.append([served])
    assert store.states([served.sample_id]) == {served.sample_id: "fresh"}  # not silently retired
    store.close()


# ----------------------------------------------------------------------------- the step's commit point
def test_a_refused_seal_drops_the_gradients_and_leaves_weights_and_optimizer_untouched(tmp_path: Path) -> None:
    import torch

    from core.config import LoRAConfig, TrainConfig
    from tests.unit.test_train_step import build_tiny_model
    from train.model import DDPBackend, build_peft_model
    from train.step import train_step

    c = TrainConfig(lora=LoRAConfig(rank=4, alpha=8), lr=1e-2)
    path = str(build_tiny_model(tmp_path / "model"))
    samples = [make_sample(reward=1.0), make_sample(reward=-1.0).model_copy(update={"response_ids": [5, 6]})]

    def lora_after(decisions: list[bool]) -> tuple[dict, list[dict]]:
        model = build_peft_model(path, c, torch.device("cpu"))
        backend = DDPBackend(model, c, torch.device("cpu"), world=1)
        metrics = [train_step(backend, samples, c, before_update=lambda d=d: d) for d in decisions]
        return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}, metrics

    untouched, _ = lora_after([])
    refused, m = lora_after([False])
    assert m[0]["discarded"] is True
    for k in untouched:
        torch.testing.assert_close(refused[k], untouched[k], rtol=0, atol=0)
    once, _ = lora_after([True])
    after_refusal, _ = lora_after([False, True])  # no gradient of the refused step leaks into the next
    for k in once:
        torch.testing.assert_close(after_refusal[k], once[k], rtol=1e-6, atol=1e-7)
