"""Replays with tools on the real stack (evolve/sandbox.py): the validation gate replays a file task through
the real PolicyEngine (vLLM, the hermes tool parser) with the workload's tools offered, runs whatever tool
calls the tiny model makes in a fresh copy of the workspace, and a real PRM actor grades the files the
replay left with the same checker that scored the user's turn. tests/unit/test_evolve_sandbox.py drives
the same loop with a scripted engine, where the outcome is known."""

from __future__ import annotations

import asyncio

import pytest

from core import names
from core.config import GateConfig, SandboxConfig
from core.contracts import Skill
from evolve.collective_runner import PrmGrade, ServeGenerate
from evolve.evidence import Evidence
from evolve.gate import Validator
from evolve.sandbox import Sandbox
from harness.tools import TOOLS

pytestmark = pytest.mark.slow

SPEC = {"type": "file_check", "command": "python scripts/check_backup.py config.json", "expect_exit": 0,
        "workspace": "alice"}
ORIGINAL, MODIFIED = '{"debug": false}', '{"debug": true}'
RULE = Skill(name="bak-copy-config", description="Back up a config file before modifying it.",
             body="Write config.json.bak with the original content before you modify config.json.")


def test_a_file_task_is_replayed_with_its_tools_and_graded_on_its_files_by_a_prm(serve_app, tmp_path):
    cfg = serve_app["config"]
    grade = PrmGrade([names.prm_name(i) for i in range(cfg.rewards.pool_size)], cfg.ray.namespace, 60.0)
    # The real PRM grades files sent with a replay where the spec's workspace is: the backup check passes
    # only when the replay left config.json modified and its original as config.json.bak.
    msgs = [{"role": "user", "content": "Set debug=true in config.json."}]
    both = {"config.json": MODIFIED.encode(), "config.json.bak": ORIGINAL.encode()}
    assert asyncio.run(grade(msgs, "done", SPEC, both)) == 1.0
    assert asyncio.run(grade(msgs, "done", SPEC, {"config.json": MODIFIED.encode()})) == 0.0
    assert asyncio.run(grade(msgs, "done", SPEC, None)) is None  # reply-only: the user's files would grade it

    src = tmp_path / "shared"
    src.mkdir()
    (src / "config.json").write_text(ORIGINAL)
    engine = ServeGenerate(names.ENGINE, names.APP, cfg.model.served_name, 120.0)
    seen: list[list[dict] | None] = []

    async def chat(messages, tools, max_tokens):  # the real engine, with what it was offered noted
        seen.append(tools)
        return await engine.chat(messages, tools, max_tokens)

    async def reply_only(messages, max_tokens):
        raise AssertionError("a task whose request offered tools is replayed with them")

    box = Sandbox(SandboxConfig(tools="harness.tools:WORKSPACE_TOOLS", workspace_src=str(src)))
    task = Evidence(turn_id="t1", session_id="s1", reward=-1.0, eval_spec=SPEC, tools=["write_file", "read_file"],
                    messages=[{"role": "system", "content": "You are a careful agent with file tools."},
                              {"role": "user", "content": "Set debug to true in config.json."}])
    v = asyncio.run(Validator(GateConfig(held_back=0, max_tokens=24), reply_only, grade, chat=chat, sandbox=box)
                    .validate(RULE, None, [task]))
    assert v.results == 1 and v.ungraded == 0  # both replays graded on the files they left
    assert v.current_mean in (0.0, 1.0) and v.candidate_mean in (0.0, 1.0)
    assert seen and all(t == TOOLS for t in seen)  # every engine call offered the workload's tools
    assert (src / "config.json").read_text() == ORIGINAL and sorted(p.name for p in src.iterdir()) == ["config.json"]
