"""What skills and memories are retrieved for (core/agent_context.py): the user's own latest words in
the requests real agents send (tests/unit/agent_side_requests.jsonl), not their tool results nor the
context they wrap around the user's message.

Seen failing before the fix: Claude Code's turn after a tool call (a user message of `tool_result` blocks
only) was served with no skills at all, and OpenClaw's turns retrieved for its internal-context message."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cluster.system import agent_markers
from core.agent_context import AGENT_CONTEXT_MARKERS, context_markers, latest_user_words, own_texts
from core.config import ClawrayConfig, ProxyConfig, SkillsConfig
from core.contracts import Sample, Skill, Turn
from evolve.bank import SkillBank
from evolve.evidence import evidence_from
from evolve.loop import failure_from
from rewards.judge import turn_parts
from serve.apis import CHAT, MESSAGES, RESPONSES
from serve.injection import SkillInjector
from tests.unit.test_serve_responses_route import _send
from tests.unit.test_serve_responses_route import proxy as responses_proxy  # noqa: F401 - the in-process Proxy

RECORDED = [json.loads(line) for line in
            Path(__file__).with_name("agent_side_requests.jsonl").read_text().splitlines()]
APIS = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}
ASKED = "Create a file hello.txt saying hello"
TOOL_LOOP = [(r["agent"], r["request"]) for r in RECORDED if r["expect"] == "main"
             and r["request"] in ("main: the first request of a prompt", "main: after its tool call ran",
                                  "main: after its tool call ran (its internal-context message last)")
             and r["agent"] != "copaw"]  # CoPaw's recording asks its bootstrap prompt, not ASKED


def find(agent: str, request: str) -> dict[str, Any]:
    return next(r for r in RECORDED if r["agent"] == agent and r["request"] == request)


def query_of(rec: dict[str, Any]) -> str:
    """The query the Proxy retrieves for (serve/proxy.py `_prepare`): read from the API's chat view."""
    return latest_user_words(APIS[rec["api"]].view(copy.deepcopy(rec["body"])).get("messages"))


def test_the_recordings_hold_a_first_request_and_a_tool_loop_turn_of_five_agents():
    agents = {a for a, _ in TOOL_LOOP}
    assert agents == {"claude-code", "codex", "qwen-code", "hermes", "openclaw"}
    assert all(sum(a == agent for a, _ in TOOL_LOOP) == 2 for agent in agents)


@pytest.mark.parametrize("agent, request_", TOOL_LOOP, ids=[f"{a}: {r}" for a, r in TOOL_LOOP])
def test_each_agents_first_request_and_tool_loop_turn_retrieve_for_what_the_user_typed(agent, request_):
    query = query_of(find(agent, request_))
    assert ASKED in query
    assert not any(m in query for m in AGENT_CONTEXT_MARKERS), query[:200]
    # OpenClaw stamps the user's message and appends its runtime line to it: neither is the user's. Seen failing
    # before: OpenClaw's query was "[Wed 2026-12-02 13:29 UTC] Create a file ...\n\nRuntime: agent=main | ...".
    assert query == ASKED


def test_claude_codes_turn_after_a_slash_command_retrieves_for_the_question_after_it():
    rec = find("claude-code", "main: the first request after /compact")
    assert query_of(rec) == "What files are in this folder?"


def test_a_marker_counts_only_at_the_start_of_a_part_and_a_message_of_only_context_is_passed_over():
    quoting = f"Why does my hook print {AGENT_CONTEXT_MARKERS[0]} into the log?"
    assert latest_user_words([{"role": "user", "content": quoting}]) == quoting
    msgs = [{"role": "user", "content": "Rename the report"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "  <system-reminder>\nThe date changed.</system-reminder>"},
            {"role": "tool", "tool_call_id": "1", "content": "ok"}]
    assert latest_user_words(msgs) == "Rename the report"
    assert latest_user_words([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]) == ""
    assert latest_user_words(None) == "" and latest_user_words([]) == ""


def test_openclaws_stamp_and_runtime_line_around_the_users_words_are_not_theirs():
    """OpenClaw 2026.9.6 sends "[<weekday> <date> <time> <zone>] <what the user typed>" and, in a conversation's
    first user message, its runtime line after it (a string: "\\n\\nRuntime: ..."; list content: a part of its
    own), moved there from the system prompt. Seen failing before: both were read as the user's words."""
    runtime = "Runtime: agent=main | session=agent:main:main | os=linux (x64) | node=v24.11.1 | model=up/m"
    first = {"role": "user", "content": f"[Wed 2026-12-02 13:29 UTC] Rename the report\n\n{runtime}"}
    assert latest_user_words([first]) == "Rename the report"
    parts = {"role": "user", "content": [{"type": "text", "text": "[Thu 2026-12-03 09:05:07 GMT+1] Back up notes"},
                                         {"type": "text", "text": runtime}]}
    assert latest_user_words([parts]) == "Back up notes"
    assert own_texts(parts["content"]) == ["Back up notes"]
    later = {"role": "user", "content": "[Wed 2026-12-02 13:31 UTC] Now list the files"}
    assert latest_user_words([first, {"role": "assistant", "content": "ok"}, later]) == "Now list the files"
    # What a user types that only looks like it stays as written: a stamp not at the start, a runtime line
    # that is not the message's last, a "Runtime:" that is not OpenClaw's key=value line.
    for typed in ("Why did the 2026-12-02 13:29 job fail?", "See [2026-12-02 13:29 UTC] in the log",
                  "Runtime: agent=main | os=linux\n\nwhy is this line in my prompt?",
                  "Compare the two.\n\nRuntime: 3 seconds on the old box"):
        assert latest_user_words([{"role": "user", "content": typed}]) == typed
    assert latest_user_words([{"role": "user", "content": runtime}]) == ""  # nothing of the user's left


def test_the_markers_are_the_operators_to_replace_or_extend():
    cfg = ProxyConfig.model_validate({"extra_agent_context_markers": ["<my-agent-context>"]})
    markers = context_markers(cfg.agent_context_markers, cfg.extra_agent_context_markers)
    assert markers == (*AGENT_CONTEXT_MARKERS, "<my-agent-context>")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Back up the notes"},
                                         {"type": "text", "text": "<my-agent-context>cwd=/w"}]}]
    assert latest_user_words(msgs, markers) == "Back up the notes"
    assert latest_user_words(msgs, context_markers([])) == "Back up the notes <my-agent-context>cwd=/w"


FILES = Skill(name="name-files-in-lowercase", category="file_operations",
              description="When you create a file, name it in lowercase with a dated suffix.",
              body="Write hello.txt as hello-2026-12-07.txt.")
COMMITS = Skill(name="sign-off-commits", category="coding",
                description="Git commits and pull requests carry a Signed-off-by trailer.",
                body="Add Signed-off-by to every git commit and pull request you create.")


@pytest.fixture
def proxy(responses_proxy, tmp_path):  # noqa: F811
    """The in-process Proxy over a fake engine, with the real template-mode skill injector on a library."""
    cfg = SkillsConfig(retrieval="template", top_k=1, task_specific_top_k=1, refresh_s=3600.0)
    SkillBank(tmp_path / "lib", cfg).add_batch([FILES, COMMITS])
    responses_proxy.injector = SkillInjector.build(cfg, tmp_path / "lib")
    return responses_proxy


def _system(api: str, body: dict[str, Any]) -> str:
    return json.dumps(body.get("system") if api == "messages" else body["messages"][0]["content"])


@pytest.mark.parametrize("agent", ["claude-code", "openclaw"])
def test_a_tool_loop_is_served_the_same_skills_as_the_request_that_started_it(proxy, agent):
    """The skill the user's request calls for, on every turn of the loop: the same system prompt each time,
    so the engine's prefix cache holds across the loop."""
    first, after = (find(agent, r) for r in ("main: the first request of a prompt", next(
        r for a, r in TOOL_LOOP if a == agent and r != "main: the first request of a prompt")))
    for rec in (first, after):
        body = {**copy.deepcopy(rec["body"]), "stream": False}
        assert _send(proxy, APIS[rec["api"]], body).status_code == 200
    (api1, sent1), (api2, sent2) = proxy.engine._target.bodies
    assert FILES.description in _system(api1, sent1), "the first request was not served the file skill"
    assert COMMITS.description not in _system(api1, sent1)
    assert FILES.description in _system(api2, sent2), "the turn after the tool call lost the skill"
    assert _system(api1, sent1) == _system(api2, sent2)
    turns = proxy.store.turns()
    assert [t.skills for t in turns] == [[FILES.name], [FILES.name]]


def test_the_injector_alone_retrieves_for_the_users_words_too(tmp_path):
    """Callers without a Proxy (the harness, scripts) get the same query by default."""
    cfg = SkillsConfig(retrieval="template", top_k=1, task_specific_top_k=1, refresh_s=3600.0)
    SkillBank(tmp_path, cfg).add_batch([FILES, COMMITS])
    injector = SkillInjector.build(cfg, tmp_path)
    body = MESSAGES.view(copy.deepcopy(find("claude-code", "main: after its tool call ran")["body"]))
    names, _ = asyncio.run(injector.inject(body, anthropic=True))
    assert names == [FILES.name]


def _turn(rec: dict[str, Any]) -> tuple[Turn, Sample]:
    messages = APIS[rec["api"]].view(copy.deepcopy(rec["body"]))["messages"]
    turn = Turn(session_id="s1", turn_index=1, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                messages=messages, response_text="", next_state=[{"role": "user", "content": "Wrong file name."}])
    return turn, Sample.from_turn(turn, reward=-1.0, trainable=True)


@pytest.mark.parametrize("agent, request_", [a for a in TOOL_LOOP if a[0] in ("claude-code", "openclaw", "qwen-code")],
                         ids=lambda v: v)
def test_the_evolvers_read_the_instruction_a_failed_turn_worked_on(agent, request_):
    """A failure the fast loop distils, and an evidence row of the collective job: the user's request, not
    Claude Code's tool result (its last user message after a tool call) or an agent's reminders."""
    turn, sample = _turn(find(agent, request_))
    assert failure_from(turn, sample).instruction.startswith(ASKED)
    assert evidence_from(turn, sample, []).instruction == failure_from(turn, sample).instruction
    # An operator's tags reach the evolvers as they reach the Proxy (cluster/system.py `agent_markers`).
    cfg = ClawrayConfig.model_validate({"proxy": {"agent_context_markers": []}})
    assert agent_markers(cfg) == () and agent_markers(ClawrayConfig()) == AGENT_CONTEXT_MARKERS
    if agent != "openclaw":
        assert failure_from(turn, sample, agent_markers(cfg)).instruction != failure_from(turn, sample).instruction


@pytest.mark.parametrize("agent, request_", [a for a in TOOL_LOOP if a[0] in ("claude-code", "openclaw")],
                         ids=lambda v: v)
def test_the_prm_judge_sees_the_request_the_turn_worked_on(agent, request_):
    """The judge's "Instruction" is the user's request and what followed it in the request (the loop's tool
    calls and results), not just Claude Code's tool result or OpenClaw's internal context after it. Seen
    failing before: the judge of those turns never saw the task it scored a reply to."""
    turn, _ = _turn(find(agent, request_))
    instruction = turn_parts(turn, use_next_state=True)["instruction"]
    assert ASKED in instruction, instruction[:300]
    if agent == "claude-code" and "tool call" in request_:
        assert "Bash completed with no output" in instruction  # the tool's result, after the request
    # The tags are the operator's (cluster/system.py passes the same ones to the PRMs): with none, OpenClaw's
    # internal context is the user's latest words again, and the judge sees only it.
    none = agent_markers(ClawrayConfig.model_validate({"proxy": {"agent_context_markers": []}}))
    if agent == "openclaw":
        assert ASKED not in turn_parts(turn, True, none)["instruction"]
