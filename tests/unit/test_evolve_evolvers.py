"""Evolvers: feedback distillation merges repeated lessons; the LLM evolver is all-or-nothing."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core.config import EvolverConfig, LLMEndpoint, SkillsConfig
from core.llm import LLMClient, LLMError
from evolve.bank import SkillBank
from evolve.evolvers import (
    EvolveError,
    Failure,
    FeedbackEvolver,
    LLMEvolver,
    extract_lessons,
    make_evolver,
    parse_skill_list,
)

BACKUP_1 = "[Previous Feedback] You must create config.json.bak before modifying config.json."
BACKUP_2 = "[Previous Feedback] must create a .bak before modifying the file"
ISO = "Wrong format. Timestamps must be ISO 8601 with +08:00; got 2024-01-01 10:00"


def fail(feedback: str, sid: str = "s1", sample: str = "x", instruction: str = "modify config.json") -> Failure:
    return Failure(instruction=instruction, response="done", feedback=feedback, reward=-1.0,
                   session_id=sid, sample_id=sample)


VALID = json.dumps([{"name": "backup-before-editing", "category": "file_operations",
                     "description": "Create a .bak copy before editing any file.",
                     "body": "# Backup\n- `cp f f.bak` before editing `f`."}])
HALF_VALID = json.dumps([json.loads(VALID)[0], {"name": "Bad Name", "description": "x", "body": ""}])


def test_extract_lessons_keeps_rules_only():
    assert extract_lessons(BACKUP_1) == ["must create config.json.bak before modifying config.json"]
    assert extract_lessons(ISO) == ["Timestamps must be ISO 8601 with +08:00"]
    assert extract_lessons("Great job, thanks!") == []
    assert extract_lessons("- Always quote paths\n- never use rm -rf") == ["Always quote paths",
                                                                          "never use rm -rf"]


def test_lessons_drop_the_verdict_a_multi_choice_feedback_starts_with():
    """MetaClaw-Bench's per-option feedback ("B is wrong: <rule>", "Correct: <rule>") states one rule per
    option: the lesson is the rule, so B's and C's feedback are the same lesson (one skill, one name)."""
    rule = "timestamps must be ISO 8601 with a T separator and the +08:00 offset"
    for fb in (f"B is wrong: {rule}.", f"Correct: {rule}.", f"C is incorrect - {rule}", f"Wrong: {rule}.",
               f"D wrong: {rule}."):
        assert extract_lessons(fb) == [rule], fb
    skills = FeedbackEvolver().distil([fail(f"B is wrong: {rule}.", "s1", "a"),
                                       fail(f"D is wrong: {rule}.", "s2", "b")], [])
    assert [s.name for s in skills] == ["timestamps-iso-8601-separator-08-00"]


def test_a_feedback_skill_states_its_rule_once_and_briefly():
    """Every injected skill costs prompt tokens on every matching turn: the rule once in the description
    and once in the body, the task it was seen in, and the feedback kept in metadata (not the prompt)."""
    (skill,) = FeedbackEvolver().distil([fail(BACKUP_1, instruction="x " * 400)], [])
    assert skill.description == "Must create config.json.bak before modifying config.json."
    assert skill.body.count("config.json.bak") == 1 and len(skill.body) < 260
    assert skill.metadata["feedback"] == BACKUP_1


def test_feedback_evolver_merges_repeated_lessons_within_a_batch():
    skills = FeedbackEvolver().distil(
        [fail(BACKUP_1, "s1", "a"), fail(BACKUP_2, "s2", "b"), fail(ISO, "s2", "c", "write the log")], [])
    assert len(skills) == 2
    backup, iso = skills
    assert backup.category == "file_operations" and "Rule:" in backup.body
    assert backup.metadata["occurrences"] == 2 and backup.metadata["origin_sessions"] == ["s1", "s2"]
    assert iso.metadata["lesson"] == "Timestamps must be ISO 8601 with +08:00"


def test_feedback_evolver_is_deterministic():
    fs = [fail(BACKUP_1), fail(ISO, "s2", "c")]
    assert FeedbackEvolver().distil(fs, []) == FeedbackEvolver().distil(fs, [])


def test_repeated_lesson_updates_the_existing_skill_instead_of_duplicating(tmp_path: Path):
    bank = SkillBank(tmp_path, SkillsConfig())
    ev = FeedbackEvolver()
    first = ev.distil([fail(BACKUP_1, "s1")], list(bank.skills()))
    assert bank.add_batch(first, ["s1"], "feedback", allow_updates=True).generation == 1
    again = ev.distil([fail(BACKUP_2, "s7")], list(bank.skills()))
    assert [s.name for s in again] == [first[0].name]  # same skill, not a new one
    r = bank.add_batch(again, ["s7"], "feedback", allow_updates=True)
    assert r.merged == [first[0].name] and r.accepted == [] and r.generation == 1
    assert len(bank) == 1
    meta = bank.get(first[0].name).metadata
    assert meta["occurrences"] == 2 and meta["origin_sessions"] == ["s1", "s7"]


async def test_feedback_without_rules_produces_nothing():
    assert await FeedbackEvolver().evolve([fail("ok whatever")], []) == []


class ScriptedClient:
    """Behind LLMClient's interface: replies from a script, records what it was sent."""

    def __init__(self, replies: list[str | Exception]):
        self.replies, self.sent = list(replies), []

    async def chat(self, messages, temperature=0.0, max_tokens=512, n=1):
        self.sent.append(list(messages))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return [reply]


async def test_llm_evolver_parses_a_valid_reply_and_sends_existing_names(tmp_path: Path):
    client = ScriptedClient([f"Here you go:\n```json\n{VALID}\n```"])
    bank = SkillBank(tmp_path, SkillsConfig())
    bank.add_batch(FeedbackEvolver().distil([fail(ISO)], []))
    skills = await LLMEvolver(client).evolve([fail(BACKUP_1)], list(bank.skills()))
    assert [s.name for s in skills] == ["backup-before-editing"]
    prompt = client.sent[0][1]["content"]
    assert BACKUP_1 in prompt and bank.names()[0] in prompt


async def test_llm_evolver_retries_invalid_output_with_the_error():
    client = ScriptedClient(["not json at all", VALID])
    skills = await LLMEvolver(client).evolve([fail(BACKUP_1)], [])
    assert len(skills) == 1 and len(client.sent) == 2
    assert "rejected" in client.sent[1][-1]["content"]


@pytest.mark.parametrize("bad", ["{}", "[1, 2]", HALF_VALID, "[" + VALID[1:-1] + "," + VALID[1:-1] + "]"])
async def test_llm_evolver_rejects_invalid_output_as_a_whole(bad: str):
    client = ScriptedClient([bad, bad, bad])
    with pytest.raises(EvolveError, match="no valid skill list after 3 attempts"):
        await LLMEvolver(client).evolve([fail(BACKUP_1)], [])
    assert len(client.sent) == 3


async def test_llm_errors_become_evolve_errors():
    with pytest.raises(EvolveError, match="boom"):
        await LLMEvolver(ScriptedClient([LLMError("boom")])).evolve([fail(BACKUP_1)], [])


def test_parse_skill_list_limits():
    with pytest.raises(ValueError, match="at most 0"):
        parse_skill_list(VALID, max_skills=0)
    assert parse_skill_list("[]", 5) == []


def test_make_evolver_registry():
    assert make_evolver(EvolverConfig()).name == "feedback"
    cfg = EvolverConfig(kind="llm", llm=LLMEndpoint(base_url="http://127.0.0.1:1/v1", model="m"))
    assert make_evolver(cfg, client=ScriptedClient([])).name == "llm"
    with pytest.raises(ValueError, match="valid: feedback, llm"):
        make_evolver(EvolverConfig.model_construct(kind="genetic"))


class _Handler(BaseHTTPRequestHandler):
    script: list[str] = []
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        content = type(self).script.pop(0)
        data = json.dumps({
            "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


async def test_llm_evolver_against_a_local_openai_compatible_server():
    _Handler.script, _Handler.bodies = ["[{\"name\": \"x\"}]", VALID], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = LLMEndpoint(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="evolver",
                               max_retries=0, timeout_s=10)
        client = LLMClient(endpoint)
        skills = await LLMEvolver(client).evolve([fail(BACKUP_1)], [])
        await client.close()
    finally:
        server.shutdown()
        server.server_close()
    assert [s.name for s in skills] == ["backup-before-editing"]
    assert len(_Handler.bodies) == 2 and _Handler.bodies[0]["model"] == "evolver"
    assert "rejected" in _Handler.bodies[1]["messages"][-1]["content"]


def test_a_lesson_keeps_the_example_its_rule_gives():
    """"..., e.g. <example>." is one sentence: cutting at "e.g." left a lesson ending ", e.g" and lost the
    example (clawray-mini's file-name and timestamp feedback)."""
    fb = "File names must be YYYYMMDD_snake_case.ext, e.g. 20260504_shipment_summary.md."
    assert extract_lessons(fb) == ["File names must be YYYYMMDD_snake_case.ext, e.g. 20260504_shipment_summary.md"]
    two = "Timestamps must use +08:00, i.e. the office's offset. Always create a .bak first."
    assert extract_lessons(two) == ["Timestamps must use +08:00, i.e. the office's offset",
                                    "Always create a .bak first"]


def test_the_task_excerpt_is_the_question_without_its_options_or_the_previous_feedback():
    """The skill is injected into every matching turn: the excerpt of the task it was learned from must not
    carry that task's option texts (another task's `+08:00` options inside a UTC skill), nor the previous
    round's feedback the driver puts in front of the question (another family's rule)."""
    task = ("[Previous Feedback] Status updates must be written in lowercase only.\n\n"
            "Which timestamps follow our team standard? Select all that apply.\n\n"
            "A. 2026-05-04T09:00:00+08:00\nB. 2026-05-04 09:00\nC) 2026-05-04T09:00:00Z\n\n"
            "Answer using \\bbox{X} or \\bbox{X,Y} format.")
    (skill,) = FeedbackEvolver().distil([fail("Timestamps must be in UTC and end with the Z suffix.",
                                              instruction=task)], [])
    seen = skill.body.split("**Seen in the task:**")[1]
    assert seen.strip() == '"Which timestamps follow our team standard? Select all that apply."'
    assert "+08:00" not in skill.body and "lowercase" not in skill.body
    # a task without options keeps its whole text (cut to the excerpt's length)
    (plain,) = FeedbackEvolver().distil([fail(BACKUP_1, instruction="Rewrite day01/a.json.\nUse write_file.")], [])
    assert plain.body.endswith('"Rewrite day01/a.json. Use write_file."')


def test_rules_in_the_same_words_about_different_things_are_different_lessons():
    """'Ticket titles must be ... lowercase' is not 'Status updates must be ... lowercase': a merge by shared
    words alone (seen: the second rule vanished into the first skill) loses a preference."""
    from evolve.evolvers import Failure, FeedbackEvolver

    status = Failure("Post a short note.", "X", "Status updates must be written in lowercase only, no capital letters.",
                     -1.0, "s1", "a")
    ticket = Failure("Write a ticket title.", "X", "Ticket titles must be written in lowercase only, no capital letters.",
                     -1.0, "s2", "b")
    skills = FeedbackEvolver().distil([status, ticket], [])
    assert sorted(s.description for s in skills) == [
        "Status updates must be written in lowercase only, no capital letters.",
        "Ticket titles must be written in lowercase only, no capital letters."]
    again = FeedbackEvolver().distil([ticket], skills[:1])  # the status skill exists: the ticket rule is new
    assert [s.description for s in again] == ["Ticket titles must be written in lowercase only, no capital letters."]
    same = FeedbackEvolver().distil([status], skills)  # the same rule again: merged, not a second skill
    assert [s.name for s in same] == [next(s.name for s in skills if s.description.startswith("Status"))]


def test_a_rule_about_a_named_subject_is_filed_by_the_subject_not_by_the_task_it_came_from():
    """Seen in the 10-seed efficacy run (docs/bench.md, seeds 6 and 8): "status updates must be written in
    lowercase only", learned from "... status update on the config change", was filed under file_operations
    (by "config"), so no status update found it, while the general ticket-title rule (uppercase) reached
    them all."""
    from evolve.evolvers import Failure, FeedbackEvolver, lesson_category

    status = Failure("Give me a one-line status update on the config change.", "X",
                     "Status updates must be written in lowercase only, no capital letters.", -1.0, "s1", "a")
    (skill,) = FeedbackEvolver().distil([status], [])
    assert skill.category == "general"
    # A lesson with a task keyword of its own, or without a subject, is still filed by the task's words too.
    assert lesson_category("timestamps must use the +08:00 offset", "Which timestamps are right?") == "data_analysis"
    assert lesson_category("file names must be kebab-case", "Rename the report") == "file_operations"
    assert lesson_category("you must create a .bak backup first", "Set retries in config.json") == "file_operations"
    assert lesson_category("Never reply with more than one line.", "Draft an email reply") == "communication"
    assert lesson_category("Ticket titles must be written in uppercase only.", "Write a ticket title.") == "general"
