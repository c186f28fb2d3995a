"""The instruction-following corpus (harness/corpus.py): served-format chats whose reply follows a rule
that is in the prompt (as a skill) or, when it is not, a rule drawn uniformly (the hidden preference)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from evolve.evolvers import extract_lessons
from harness.corpus import CASED, FAMILIES, PERSONAS, RULES, choice_reply, example, examples, feedback_for
from harness.workload import load_workload
from rewards.checkers import evaluate
from rewards.checkers.choice import parse_choices
from scripts.instruct_eval import WORKLOAD, workload_skills


def _lessons(rule) -> set[str]:
    return {x.lower() for t in rule.texts for x in extract_lessons(t)}


def _stated(rule, text: str) -> bool:
    return any(x in text.lower() for x in _lessons(rule))


def test_the_corpus_is_seeded():
    for phase in ("short", "served"):
        a, b = list(examples(20, 3, phase)), list(examples(20, 3, phase))
        assert [(e.messages, e.reply) for e in a] == [(e.messages, e.reply) for e in b]
        assert [e.reply for e in examples(20, 4, phase)] != [e.reply for e in a]


def test_every_phrasing_is_one_lesson_of_the_feedback_evolver_in_every_feedback_form():
    """The closed vocabulary: whatever form the feedback takes, the skill states the phrasing itself."""
    rng = random.Random(0)
    for rule in RULES.values():
        for text in rule.texts:
            for _ in range(12):
                (bare,) = extract_lessons(text)
                fb = feedback_for(rule, rng, text)
                (lesson,) = extract_lessons(fb)
                # "..., e.g. <example>." is one lesson: the rule keeps its example (evolve/evolvers.py)
                assert lesson.lower() in (bare.lower(), f"{bare}, e.g. {rule.example}".lower()), fb


def test_the_workloads_rules_are_in_the_vocabulary():
    """Every lesson clawray-mini's feedback teaches about a family the corpus knows is one of its phrasings
    (what the skills of the bench will state is what the model was trained to read)."""
    vocab = {x for r in RULES.values() for x in _lessons(r)}
    lessons = [s.metadata["lesson"].lower() for s in workload_skills(load_workload(WORKLOAD))]
    keyed = [x for x in lessons if any(k in x for k in ("timestamp", "file name", ".bak", "status", "ticket"))]
    assert len(keyed) >= 5 and set(keyed) <= vocab, set(keyed) - vocab
    assert any("ticket" in x for x in keyed) and any("status" in x for x in keyed)


@pytest.mark.parametrize("phase", ["short", "served"])
def test_every_reply_passes_the_check_of_its_rule(phase):
    for e in examples(300, 1, phase):
        if e.family in CASED:
            letters = [c for c in e.reply if c.isalpha()]
            lower = e.rule in ("lower", "ticket_lower")
            assert all(c.islower() for c in letters) if lower else all(c.isupper() for c in letters)
            assert e.spec["type"] == ("lowercase" if lower else "uppercase")
            assert evaluate(e.spec, e.reply, None).passed
            continue
        assert e.spec["type"] == "multi_choice" and e.spec["answer"], e
        assert evaluate(e.spec, e.reply, None).passed, (e.reply, e.spec)
        # the marks in front of the box say the same: `+` exactly on the letters of the answer
        marks = e.reply.split("\n")[0].split()
        assert [m[0] for m in marks] == sorted(e.spec["options"])
        assert [m[0] for m in marks if m.endswith("+")] == e.spec["answer"]


def test_choice_reply_marks_then_boxes():
    r = choice_reply([("A", True), ("B", False), ("C", True)])
    assert r == "A+ B- C+\n\\bbox{A,C}" and parse_choices(r, {"A", "B", "C"}) == {"A", "C"}


@pytest.mark.parametrize("phase", ["short", "served"])
def test_the_rule_is_in_the_prompt_exactly_when_told_and_in_the_served_format(phase):
    for e in examples(300, 5, phase):
        system = e.messages[0]["content"]
        assert e.messages[0]["role"] == "system" and any(system.startswith(p) for p in PERSONAS)
        rules = _lessons(RULES[e.rule])
        assert any(r in system.lower() for r in rules) == e.told, (e.told, system)
        if "## Active Skills" in system:  # serve/injection.py appends the block after a blank line
            assert "\n\n## Active Skills\n\nApply the skills below" in system
        # the rule is stated nowhere else (the feedback prefix and the history are about other families)
        assert not any(r in m["content"].lower() for r in rules for m in e.messages[1:])
        if phase == "short":
            assert len(e.messages) == 2 and not e.history_right


def test_served_chats_carry_the_previous_round_as_the_driver_sends_it():
    exs = list(examples(300, 6))
    with_history = [e for e in exs if e.history_right]
    assert 0.6 < len(with_history) / len(exs) < 0.9
    assert {(len(e.messages) - 2) // 2 for e in with_history} == {1, 2, 3}  # earlier rounds per chat
    for e in with_history:
        roles = [m["role"] for m in e.messages]
        assert roles == ["system"] + ["user", "assistant"] * ((len(roles) - 2) // 2) + ["user"]
        assert not e.messages[1]["content"].startswith("[Previous Feedback]")  # the day's first round has none
    assert sum(e.messages[-1]["content"].startswith("[Previous Feedback] ") for e in with_history) > 0.5 * len(with_history)


def test_without_the_rule_the_reply_follows_a_uniform_guess():
    """The bare model cannot know which rule a user wants: untold replies spread over the family's rules."""
    untold = [e for e in examples(2000, 7) if not e.told]
    for family, rules in FAMILIES.items():
        seen = Counter(e.rule for e in untold if e.family == family)
        total = sum(seen.values())
        assert total > 60
        for r in rules:
            assert abs(seen[r.key] / total - 1 / len(rules)) < 0.12, (family, seen)


def test_told_can_be_forced_for_held_out_sets():
    rng = random.Random(9)
    assert all(example(rng, "served", told=True).told for _ in range(20))
    assert not any(example(rng, "served", told=False).told for _ in range(20))


def test_a_cased_reply_follows_the_rule_of_its_own_kind_when_both_kinds_are_told():
    """Status updates and ticket titles have rules in the same words: where both are in the prompt (often in
    opposite cases), the reply takes its own kind's case."""
    both = 0
    for e in examples(400, 8):
        system = e.messages[0]["content"].lower()
        if e.family not in CASED or not e.told or not ("status updates must" in system and "ticket titles must" in system):
            continue
        both += 1
        lower = e.rule in ("lower", "ticket_lower")
        kind = "status updates" if e.family == "status" else "ticket titles"
        assert any(f"{kind} must {w}" in system for w in ("be written in lowercase", "be all lowercase")) == lower
    assert both > 20
