"""Extraction: the offline rules, and the LLM extractor's strict JSON parsing and re-asks."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.llm import LLMError
from memory.extract import OfflineExtractor, episode, extract_facts, sentences, third_person, working_summary
from memory.llm_extract import ExtractionError, LLMExtractor, parse_reply
from memory.units import Kind, Level
from tests.memory_fakes import entry


def facts(text: str) -> list[tuple[str, str, str | None, str]]:
    return [(c.kind.value, c.level.value, c.key, c.content) for c in extract_facts([entry(text)])]


def test_offline_rules_propose_one_unit_per_statement_in_the_third_person():
    got = facts("My editor is vim. I prefer tabs over spaces. Always answer in French. "
                "The billing migration is blocked on the DB team. Next step: write the rollback script. "
                "Remember that the deploy target is eu-west-1. I work at Acme. We use Postgres 16.")
    assert got == [
        ("semantic", "user", "editor", "The user's editor is vim."),
        ("preference", "user", None, "The user prefers tabs over spaces."),
        ("preference", "user", None, "Standing instruction from the user: Always answer in French."),
        ("project_state", "workspace", "status of billing migration", "Billing migration is blocked on the DB team."),
        ("project_state", "workspace", "next step", "Next step: write the rollback script."),
        ("semantic", "workspace", None, "The deploy target is eu-west-1."),
        ("semantic", "user", "employer", "The user works at Acme."),
        ("semantic", "workspace", None, "The user uses Postgres 16."),
    ]


def test_offline_rules_skip_questions_code_negations_and_small_talk():
    assert facts("Is my build broken? ```\nmy x is 3\n``` My name is not Bob. Thanks, that works great.") == []


def test_remember_wraps_a_slot_fact_with_high_confidence():
    (c,) = extract_facts([entry("Please remember that my timezone is Europe/Paris.")])
    assert (c.kind, c.level, c.key, c.confidence) == (Kind.semantic, Level.user, "timezone", 0.9)


def test_a_favourite_is_a_preference_with_a_slot():
    (c,) = extract_facts([entry("My favourite test runner is pytest")])
    assert (c.kind, c.key, c.content) == (Kind.preference, "favourite test runner",
                                          "The user's favourite test runner is pytest.")


def test_third_person_rewrites_first_and_second_person():
    assert third_person("I told you my plan, give me yours") == \
        "the user told the assistant the user's plan, give the user yours"


def test_sentences_drop_code_blocks_and_questions():
    assert sentences("Fix it.\n```py\nprint(1)\n```\nWhy not?\n- bullet item here") == ["Fix it.", "bullet item here"]


def test_each_candidate_names_its_source_turn():
    cands = extract_facts([entry("My editor is vim.", turn="a"), entry("I prefer dark mode.", turn="b")])
    assert [c.source_turns for c in cands] == [["a"], ["b"]]


def test_episode_and_rolling_working_summary():
    batch = [entry(f"Question number {i} about the parser.", turn=f"t{i}", index=i) for i in range(5)]
    ep = episode(batch)
    assert ep.kind == Kind.episodic and ep.content.startswith("On 2023-11-14 the user asked: Question number 0")
    assert ep.content.endswith("(and 2 more)") and len(ep.source_turns) == 5
    first = working_summary(batch[:2], None, 2)
    second = working_summary(batch[2:], first.content, 5)
    assert (second.kind, second.level, second.key) == (Kind.working_summary, Level.session, "summary")
    assert second.content.startswith("Session so far (5 turns). Topics: Question number 0")
    assert "Question number 4" in second.content


def test_offline_extractor_adds_the_episode():
    got = asyncio.run(OfflineExtractor().extract([entry("My editor is vim.")]))
    assert [c.kind for c in got] == [Kind.semantic, Kind.episodic]


# ---- LLM extractor --------------------------------------------------------------------------------------
GOOD = {"units": [{"kind": "preference", "content": "The user prefers short answers.", "key": None,
                   "scope": "user", "confidence": 0.8},
                  {"kind": "working_summary", "content": "Talked about X.", "key": "whatever",
                   "scope": "user", "confidence": 0.5}]}


def test_parse_reply_accepts_the_schema_in_or_out_of_a_fence():
    for text in (json.dumps(GOOD), f"```json\n{json.dumps(GOOD)}\n```"):
        a, b = parse_reply(text, ["t1"])
        assert (a.kind, a.level, a.key, a.source_turns) == (Kind.preference, Level.user, None, ["t1"])
        assert (b.kind, b.level, b.key) == (Kind.working_summary, Level.session, "summary")  # forced


@pytest.mark.parametrize("text, why", [
    ("sure! here you go", "not JSON"),
    ('{"units": [{"kind": "opinion", "content": "x", "key": null, "scope": "user", "confidence": 1}]}', "units.0.kind"),
    ('{"units": [{"kind": "semantic", "content": "x", "scope": "user", "confidence": 1, "extra": 1}]}', "extra"),
    ('{"units": [{"kind": "semantic", "content": "", "key": null, "scope": "user", "confidence": 1}]}', "content"),
    ('{"units": [{"kind": "semantic", "content": "x", "key": null, "scope": "team", "confidence": 1}]}', "scope"),
    ('{"units": [{"kind": "semantic", "content": "x", "key": null, "scope": "user", "confidence": 2}]}', "confidence"),
    ('{"memories": []}', "units: Field required"),
    ('[]', "root"),
])
def test_parse_reply_refuses_anything_else_and_says_why(text, why):
    with pytest.raises(ExtractionError, match=why):
        parse_reply(text, [])


class ScriptedClient:
    def __init__(self, replies: list):
        self.replies, self.requests = list(replies), []

    async def chat(self, messages, **kw):
        self.requests.append(list(messages))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return [reply]


def test_llm_extractor_re_asks_with_the_reason_then_succeeds():
    client = ScriptedClient(["nope", json.dumps(GOOD)])
    ex = LLMExtractor(client, retries=2)
    got = asyncio.run(ex.extract([entry("I like short answers")]))
    assert len(got) == 2 and ex.invalid_replies == 1
    retry = client.requests[1]
    assert retry[-2] == {"role": "assistant", "content": "nope"} and "not JSON" in retry[-1]["content"]
    assert "User: I like short answers" in client.requests[0][1]["content"]


def test_llm_extractor_gives_up_after_its_retries():
    client = ScriptedClient(["a", "b", "c"])
    with pytest.raises(ExtractionError):
        asyncio.run(LLMExtractor(client, retries=2).extract([entry("x y z")]))
    assert len(client.requests) == 3


def test_llm_errors_propagate_unchanged():
    client = ScriptedClient([LLMError("down", retryable=True)])
    with pytest.raises(LLMError):
        asyncio.run(LLMExtractor(client).extract([entry("x y z")]))


def test_the_llm_extractor_goes_through_the_one_llm_client_to_a_real_endpoint():
    """Through `core.llm.LLMClient` to an OpenAI-compatible server: an invalid reply is re-asked, a valid
    one parsed; a server that keeps failing raises a retryable LLMError (the ingestor retries later)."""
    from core.config import LLMEndpoint
    from core.llm import LLMClient
    from tests.fake_judge import FakeJudge, Script

    with FakeJudge(Script(replies=["Sure, here it is: {units: []}", json.dumps(GOOD)])) as server:
        ep = LLMEndpoint(base_url=server.base_url, model="m", max_retries=0, timeout_s=10)
        got = asyncio.run(LLMExtractor(LLMClient(ep), retries=1).extract([entry("I like short answers")]))
        assert [c.kind for c in got] == [Kind.preference, Kind.working_summary]
        assert len(server.script.requests) == 2
    with FakeJudge(Script(fail_status=503)) as server:
        ep = LLMEndpoint(base_url=server.base_url, model="m", max_retries=1, backoff_s=0.01, timeout_s=10)
        with pytest.raises(LLMError) as err:
            asyncio.run(LLMExtractor(LLMClient(ep)).extract([entry("I like short answers")]))
        assert err.value.retryable
