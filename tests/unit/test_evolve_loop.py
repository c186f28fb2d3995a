"""EvolutionLoop: triggers, support set, generation notices, counters (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import EvolverConfig, SkillsConfig
from core.contracts import Sample, Turn, TurnType
from evolve.bank import SkillBank
from evolve.evolvers import EvolveError, FeedbackEvolver
from evolve.loop import EvolutionLoop, failure_from

FEEDBACK = "[Previous Feedback] You must create config.json.bak before modifying config.json."


class RecordingReplay:
    """Records the support sets and generations of the evolutions that changed S."""

    def __init__(self):
        self.support: list[list[str]] = []
        self.generations: list[int] = []
        self.fences = 0  # begin_evolution calls
        self._claims: dict[str, list[str]] = {}

    async def begin_evolution(self, sample_ids, ttl_s):
        self.fences += 1
        token = str(len(self._claims))
        self._claims[token] = list(sample_ids)
        return token, list(sample_ids)

    async def end_evolution(self, token, generation, release_ids):
        if generation is not None:
            self.support.append(self._claims[token])
            self.generations.append(generation)


def turn_and_sample(sid: str, i: int, reward: float, feedback: str | None = None, last: bool = False,
                    side: bool = False) -> tuple[Turn, Sample]:
    turn = Turn(session_id=sid, turn_index=i, prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-1.0],
                messages=[{"role": "user", "content": "Please modify config.json to set debug=true"}],
                response_text="Done.", last_in_session=last,
                turn_type=TurnType.side if side else TurnType.main,
                next_state=[{"role": "user", "content": feedback}] if feedback else None)
    return turn, Sample.from_turn(turn, reward=reward, trainable=True)


def make_loop(tmp_path: Path, **cfg) -> tuple[EvolutionLoop, RecordingReplay]:
    replay = RecordingReplay()
    bank = SkillBank(tmp_path, SkillsConfig())
    return EvolutionLoop(bank, EvolverConfig(**cfg), FeedbackEvolver(), replay), replay


async def test_session_end_evolves_marks_support_and_announces_generation(tmp_path: Path):
    loop, replay = make_loop(tmp_path, failure_rate_threshold=1.0)  # only the session end triggers
    t0, s0 = turn_and_sample("s1", 0, -1.0, FEEDBACK)
    assert await loop.observe(t0, s0) is None
    t1, s1 = turn_and_sample("s1", 1, 1.0, last=True)
    report = await loop.observe(t1, s1)
    assert report.trigger == "session_end" and report.failures == 1 and report.generation == 1
    assert report.accepted == ["create-config-json-bak-before-modifying"]
    assert replay.support == [[s0.sample_id]] and replay.generations == [1]
    assert loop.bank.generation == 1 and len(loop.bank) == 1
    assert loop.stats()["evolutions_accepted"] == 1 and loop.pending() == {}


async def test_failure_rate_trigger_fires_on_first_failure_by_default(tmp_path: Path):
    loop, _ = make_loop(tmp_path)
    report = await loop.observe(*turn_and_sample("s1", 0, -1.0, FEEDBACK))
    assert report is not None and report.trigger == "failure_rate"


async def test_every_n_turns_and_min_failures(tmp_path: Path):
    loop, _ = make_loop(tmp_path, every_n_turns=3, failure_rate_threshold=1.0, min_failures=1)
    assert await loop.observe(*turn_and_sample("s1", 0, 1.0)) is None
    assert await loop.observe(*turn_and_sample("s1", 1, -1.0, FEEDBACK)) is None
    report = await loop.observe(*turn_and_sample("s1", 2, 1.0))
    assert report.trigger == "every_n_turns"
    loop2, _ = make_loop(tmp_path / "b", min_failures=2, failure_rate_threshold=0.0)
    assert await loop2.observe(*turn_and_sample("s1", 0, -1.0, FEEDBACK)) is None
    assert (await loop2.observe(*turn_and_sample("s1", 1, 0.0, FEEDBACK))).failures == 2


async def test_side_turns_and_successful_sessions_do_not_evolve(tmp_path: Path):
    loop, replay = make_loop(tmp_path)
    assert await loop.observe(*turn_and_sample("s1", 0, -1.0, FEEDBACK, side=True)) is None
    assert await loop.observe(*turn_and_sample("s1", 1, 1.0, last=True)) is None
    assert loop.stats()["evolutions_triggered"] == 0 and replay.support == []


async def test_a_failure_without_a_lesson_opens_no_fence_and_stays_a_query_sample(tmp_path: Path):
    """A failed single-turn session has no next state: the feedback evolver can learn nothing from it,
    so the loop must not claim it as support even for the length of an evolution (an open fence blocks
    training seals, and a sample read meanwhile would look like support: CI saw exactly that)."""
    loop, replay = make_loop(tmp_path)
    report = await loop.observe(*turn_and_sample("s1", 0, -1.0, last=True))
    assert report is not None and report.failures == 0 and report.generation == 0
    assert replay.fences == 0 and loop.bank.generation == 0
    assert "lesson" in report.error and loop.stats()["evolutions_triggered"] == 1
    # Mixed: only the failure that carries a lesson is claimed.
    t_a, s_a = turn_and_sample("s2", 0, -1.0)
    t_b, s_b = turn_and_sample("s2", 1, -1.0, FEEDBACK, last=True)
    loop2, replay2 = make_loop(tmp_path / "b", failure_rate_threshold=1.0)
    await loop2.observe(t_a, s_a)
    report = await loop2.observe(t_b, s_b)
    assert report.failures == 1 and replay2.support == [[s_b.sample_id]]


async def test_repeated_lesson_across_sessions_merges_without_a_new_generation(tmp_path: Path):
    loop, replay = make_loop(tmp_path)
    await loop.observe(*turn_and_sample("s1", 0, -1.0, FEEDBACK))
    report = await loop.observe(*turn_and_sample("s2", 0, -1.0, FEEDBACK))
    assert report.merged and not report.accepted and report.generation == 1
    # Only the evolution that changed S made a support set; the re-found lesson stays a query sample.
    assert replay.generations == [1] and len(replay.support) == 1


async def test_evolve_now_and_evolver_errors_are_counted(tmp_path: Path):
    loop, _ = make_loop(tmp_path, failure_rate_threshold=1.0, on_session_end=False)
    await loop.observe(*turn_and_sample("s1", 0, -1.0, FEEDBACK))
    assert loop.pending() == {"s1": 1}

    class Broken:
        name = "broken"

        def teaches(self, failure):
            return True

        async def evolve(self, failures, existing):
            raise EvolveError("model unreachable")

    loop.evolver = Broken()
    report = await loop.evolve_now("s1")
    assert report.error == "model unreachable" and loop.stats()["evolutions_rejected"] == 1
    assert await loop.evolve_now() is None  # nothing left


async def test_an_ended_session_keeps_its_failures_for_a_manual_evolution(tmp_path: Path):
    """With no trigger fired, an ended session's failures wait for `evolve_now` (`clawray skills evolve
    --now`, the demo's midday evolution) instead of being dropped at the session's end."""
    loop, replay = make_loop(tmp_path, failure_rate_threshold=1.0, on_session_end=False)
    t0, s0 = turn_and_sample("s1", 0, -1.0, FEEDBACK)
    await loop.observe(t0, s0)
    await loop.observe(*turn_and_sample("s1", 1, 1.0, last=True))
    await loop.observe(*turn_and_sample("s2", 0, 1.0, last=True))  # nothing to learn: forgotten
    assert loop.pending() == {"s1": 1}
    report = await loop.evolve_now()
    assert report is not None and report.trigger == "manual" and report.generation == 1
    assert replay.support == [[s0.sample_id]] and loop.pending() == {}


@pytest.mark.parametrize("content", [
    "the text",
    [{"type": "text", "text": "the text"}],
    [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "tool_result", "content": [
        {"type": "text", "text": "the text"}]}],
])
def test_failure_from_reads_user_message_and_next_state(content):
    turn, sample = turn_and_sample("s1", 0, -1.0, FEEDBACK)
    turn = turn.model_copy(update={"messages": [{"role": "system", "content": "sys"},
                                                {"role": "user", "content": content}],
                                   "tool_calls": [{"function": {"name": "write", "arguments": "{}"}}]})
    f = failure_from(turn, sample)
    assert f.instruction == "the text" and f.feedback == FEEDBACK and f.sample_id == sample.sample_id
    assert "write{}" in f.response
