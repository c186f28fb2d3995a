"""Replays with tools (evolve/sandbox.py): the validation gate replays a task whose request offered the
workload's tools as an agent loop in a fresh copy of the workspace, and the PRM's real checkers grade the
files it left (rewards/scorer.py `grade(..., files)`). The engine is a scripted `chat` here;
tests/integration/test_collective_sandbox.py runs the same replay through vLLM and a PRM actor."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from core.config import GateConfig, RewardsConfig, SandboxConfig
from core.contracts import Sample, Skill, Turn, tool_names
from evolve.evidence import Evidence, evidence_from
from evolve.gate import Validator
from evolve.sandbox import Sandbox, SandboxError, load_tools, snapshot, task_messages
from harness.tools import TOOLS
from rewards.scorer import Scorer
from serve.turns import extract_meta

# A file check of the demo's workload (MetaClaw-Bench P4): config.json modified, its original kept as .bak.
SPEC = {"type": "file_check", "command": "python scripts/check_backup.py config.json", "expect_exit": 0,
        "workspace": "alice"}
RULE = Skill(name="bak-copy-config", description="Back up a config file before modifying it.",
             body="Write config.json.bak with the original content before you modify config.json.")
ORIGINAL, MODIFIED = '{"debug": false}', '{"debug": true}'


def call(name: str, **args) -> dict:
    return {"id": f"c-{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


class ScriptedChat:
    """The engine: reads the config and writes it modified; with the rule in its system prompt it writes
    the backup first."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[dict], list[dict] | None]] = []

    async def __call__(self, messages, tools, max_tokens):
        self.requests.append(([dict(m) for m in messages], tools))
        if messages[-1]["role"] == "tool":
            return {"content": "done", "tool_calls": None}
        if not tools:
            return {"content": "I cannot write files."}
        backup = [call("write_file", path="config.json.bak", content=ORIGINAL)] \
            if "bak-copy-config" in str(messages[0].get("content")) else []
        return {"content": "", "tool_calls": [call("read_file", path="config.json"), *backup,
                                              call("write_file", path="config.json", content=MODIFIED)]}


@pytest.fixture
def src(tmp_path) -> Path:
    ws = tmp_path / "shared"
    ws.mkdir()
    (ws / "config.json").write_text(ORIGINAL)
    return ws


def sandbox(src: Path | None, **kw) -> Sandbox:
    return Sandbox(SandboxConfig(tools="harness.tools:WORKSPACE_TOOLS", workspace_src=str(src) if src else None, **kw))


def task(turn_id: str, tools=("write_file", "read_file")) -> Evidence:
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Set debug=true."},
            {"role": "assistant", "content": "", "tool_calls": [call("write_file", path="config.json", content="x")]},
            {"role": "tool", "tool_call_id": "c-write_file", "content": "wrote config.json"}]
    return Evidence(turn_id=turn_id, session_id=turn_id, reward=-1.0, eval_spec=SPEC, messages=msgs, tools=list(tools))


def test_the_task_is_the_conversation_up_to_its_last_user_message():
    msgs = task("t").messages
    assert task_messages(msgs) == msgs[:2]
    assert task_messages([{"role": "system", "content": "s"}]) == [{"role": "system", "content": "s"}]


def test_a_replay_runs_the_tools_in_its_own_copy_and_returns_the_files_it_left(src):
    chat = ScriptedChat()
    box = sandbox(src)
    reply, files = asyncio.run(box.replay(chat, task("t").messages, ["write_file", "read_file"], 64))
    assert reply == "done" and files == {"config.json": MODIFIED.encode()}
    sent, tools = chat.requests[1]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assert sent[3]["content"] == ORIGINAL and sent[4]["content"] == "wrote config.json"
    assert [t["function"]["name"] for t in tools] == ["write_file", "read_file"]
    assert (src / "config.json").read_text() == ORIGINAL  # the workload's copy is untouched
    # Only the tools the request offered; none offered: a plain reply and the untouched copy.
    assert [tool_names([t]) for t in box.offered(["read_file", "shell"])] == [["read_file"]]
    reply, files = asyncio.run(box.replay(chat, task("t").messages, [], 64))
    assert reply == "I cannot write files." and files == {"config.json": ORIGINAL.encode()}


def test_tool_steps_stop_at_max_steps_and_a_failing_tool_is_an_error_result(tmp_path):
    class Loop:
        n = 0

        async def __call__(self, messages, tools, max_tokens):
            self.n += 1
            return {"content": f"step {self.n}", "tool_calls": [call("read_file", path="../../etc/passwd")]}

    chat = Loop()
    reply, files = asyncio.run(sandbox(None, max_steps=1).replay(chat, task("t").messages, ["read_file"], 8))
    assert (reply, files, chat.n) == ("step 2", {}, 2)  # the last step's calls are not run


def test_bad_tool_sets_and_oversized_workspaces_are_clear_errors(tmp_path, src):
    for path, why in [("harness.tools", "module:attribute"), ("harness.nope:X", "cannot be loaded"),
                      ("harness.tools:TOOLS", "`specs` list")]:
        with pytest.raises(SandboxError, match=why):
            load_tools(path)
    with pytest.raises(SandboxError, match="not a directory"):
        sandbox(tmp_path / "missing")
    (src / "big.bin").write_bytes(b"x" * 100)
    (src / "link").symlink_to("/etc/hostname")
    assert set(snapshot(src, 1000)) == {"config.json", "big.bin"}  # links are not followed
    with pytest.raises(SandboxError, match="max_bytes"):
        snapshot(src, 50)


async def test_the_prm_grades_the_files_a_replay_left_where_the_specs_workspace_is():
    s = Scorer(RewardsConfig(checkers=["file_check", "multi_choice"]))
    msgs = [{"role": "user", "content": "Set debug=true."}]
    backed_up = {"config.json": MODIFIED.encode(), "config.json.bak": ORIGINAL.encode()}
    assert await s.grade(msgs, "done", SPEC, backed_up) == 1.0
    assert await s.grade(msgs, "done", SPEC, {"config.json": MODIFIED.encode()}) == 0.0  # no backup
    assert await s.grade(msgs, "done", SPEC, {}) == 0.0  # the replay wrote nothing
    assert await s.grade(msgs, "done", SPEC, None) is None  # reply-only: the user's files would grade it
    assert await s.grade(msgs, "done", SPEC, {"../escape.md": b"x"}) is None  # a path out of the folder


def test_the_gate_approves_a_skill_whose_replays_write_the_checked_file(src):
    chat = ScriptedChat()
    scorer = Scorer(RewardsConfig(checkers=["file_check"]))

    async def generate(messages, max_tokens):
        raise AssertionError("a task that offered tools is replayed with them")

    v = asyncio.run(Validator(GateConfig(held_back=0), generate, scorer.grade, chat=chat, sandbox=sandbox(src))
                    .validate(RULE, None, [task("a"), task("b")]))
    assert v.approved and (v.results, v.current_mean, v.candidate_mean) == (2, 0.0, 1.0)
    assert len(chat.requests) == 8  # 2 tasks x (A, B) x (tool step, final reply)

    # A task's tool steps are turns of one task: replayed once, from its start.
    step0 = task("a").model_copy(update={"turn_id": "a0", "messages": task("a").messages[:2]})
    chat.requests.clear()
    v = asyncio.run(Validator(GateConfig(held_back=0), generate, scorer.grade, chat=chat, sandbox=sandbox(src))
                    .validate(RULE, None, [step0, task("a")]))
    assert v.results == 1 and len(chat.requests) == 4

    # Without a sandbox the same tasks are graded on the reply alone: the file check cannot say.
    async def reply_only(messages, max_tokens):
        return "done"

    v = asyncio.run(Validator(GateConfig(held_back=0), reply_only, scorer.grade).validate(RULE, None, [task("a")]))
    assert not v.approved and v.ungraded == 1


def test_the_tools_a_request_offered_are_recorded_on_its_turn_and_evidence():
    chat = {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS}
    anthropic = {"messages": [{"role": "user", "content": "q"}], "tools": [{"name": "Bash", "input_schema": {}}]}
    responses = {"input": "q", "tools": [{"type": "function", "name": "shell"}, {"type": "web_search"}]}
    assert extract_meta(chat, {}, "k").tools == ("write_file", "read_file")
    assert extract_meta(anthropic, {}, "k").tools == ("Bash",)
    assert extract_meta(responses, {}, "k", []).tools == ("shell",)
    turn = Turn(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1],
                messages=chat["messages"], tools=["write_file"], eval_spec=SPEC)
    row = evidence_from(turn, Sample.from_turn(turn, 1.0, True), [])
    assert row.tools == ["write_file"]


def test_a_task_is_replayed_from_the_files_it_started_with_not_the_workloads_copy(tmp_path, src):
    """Earlier tasks of the day changed the user's files: the replay starts where the task started (the
    snapshot its check names under `snapshot_root`), so the agent reads what it read then."""
    snaps = tmp_path / "workspaces"
    before = snaps / ".snapshots" / "alice-day01" / "r3"
    before.mkdir(parents=True)
    (before / "config.json").write_text('{"debug": false, "retries": 5}')
    chat = ScriptedChat()
    box = sandbox(src, snapshot_root=str(snaps))
    spec = {**SPEC, "workspace_before": ".snapshots/alice-day01/r3"}
    start = box.start_for(spec)
    assert start == before.resolve() and box.start_for(SPEC) is None
    _, files = asyncio.run(box.replay(chat, task("t").messages, ["write_file", "read_file"], 64, start))
    assert chat.requests[1][0][3]["content"] == '{"debug": false, "retries": 5}'  # what read_file saw
    assert files == {"config.json": MODIFIED.encode()}
    # A named snapshot outside the root, or gone, cannot be replayed faithfully: an error, never another copy.
    for rel in ("../shared", ".snapshots/alice-day01/r9"):
        with pytest.raises(SandboxError, match="not a folder under snapshot_root"):
            box.start_for({**SPEC, "workspace_before": rel})
    assert sandbox(src).start_for(spec) is None  # no snapshot_root configured: the workload's copy


def test_the_gate_leaves_out_a_task_whose_snapshot_is_gone(tmp_path, src):
    chat = ScriptedChat()
    scorer = Scorer(RewardsConfig(checkers=["file_check"]))

    async def generate(messages, max_tokens):
        raise AssertionError("not a reply-only task")

    gone = task("a").model_copy(update={"eval_spec": {**SPEC, "workspace_before": ".snapshots/x/r1"}})
    box = sandbox(src, snapshot_root=str(tmp_path / "workspaces"))
    v = asyncio.run(Validator(GateConfig(held_back=0), generate, scorer.grade, chat=chat, sandbox=box)
                    .validate(RULE, None, [gone]))
    assert v.ungraded == 1 and v.results == 0 and not chat.requests


def test_the_snapshot_key_is_not_an_argument_of_the_checker(tmp_path):
    from rewards.checkers import evaluate

    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "config.json").write_text(MODIFIED)
    (tmp_path / "alice" / "config.json.bak").write_text(ORIGINAL)
    res = evaluate({**SPEC, "workspace_before": ".snapshots/alice/r1"}, "done", tmp_path)
    assert res.score == 1.0
