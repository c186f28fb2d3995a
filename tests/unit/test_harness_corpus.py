"""The instruction-following corpus (harness/corpus.py): served-format chats whose reply follows a rule
that is in the prompt (as a skill) or, when it is not, a rule drawn uniformly (the hidden preference)."""

from __future__ import annotations

from collections import Counter

import pytest

from evolve.evolvers import extract_lessons
from harness.corpus import FAMILIES, PERSONAS, RULES, examples
from rewards.checkers import evaluate


def test_the_corpus_is_seeded():
    a, b = list(examples(20, 3)), list(examples(20, 3))
    assert [(e.messages, e.reply) for e in a] == [(e.messages, e.reply) for e in b]
    assert [e.reply for e in examples(20, 4)] != [e.reply for e in a]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_reply_passes_the_check_of_its_rule(seed):
    for e in examples(200, seed):
        if e.family == "status":
            letters = [c for c in e.reply if c.isalpha()]
            assert all(c.islower() for c in letters) if e.rule == "lower" else all(c.isupper() for c in letters)
            if e.rule == "lower":
                assert evaluate(e.spec, e.reply, None).passed
        else:
            assert e.spec["type"] == "multi_choice" and e.spec["answer"], e
            assert evaluate(e.spec, e.reply, None).passed, (e.reply, e.spec)


def test_the_rule_is_in_the_prompt_exactly_when_told_and_in_the_served_format():
    for e in examples(300, 5):
        system = e.messages[0]["content"]
        assert e.messages[0]["role"] == "system" and any(system.startswith(p) for p in PERSONAS)
        (rule,) = [x.lower() for x in extract_lessons(RULES[e.rule].text)]  # as the skill states it
        assert (rule in system.lower()) == e.told, (e.told, system)
        if "## Active Skills" in system:  # serve/injection.py appends the block after a blank line
            assert "\n\n## Active Skills\n\nApply the skills below" in system
        # the rule is stated nowhere else (the feedback prefix is about other families)
        assert all(rule not in m["content"].lower() for m in e.messages[1:])


def test_without_the_rule_the_reply_follows_a_uniform_guess():
    """The bare model cannot know which rule a user wants: untold replies spread over the family's rules."""
    untold = [e for e in examples(2000, 7) if not e.told]
    for family, rules in FAMILIES.items():
        seen = Counter(e.rule for e in untold if e.family == family)
        total = sum(seen.values())
        assert total > 60
        for r in rules:
            assert abs(seen[r.key] / total - 1 / len(rules)) < 0.12, (family, seen)
