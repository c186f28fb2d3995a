"""Replaying a recorded task with the agent's tools, in a sandbox (the validation gate, evolve/gate.py).

A task whose check reads files the agent wrote (a `file_check`) cannot be graded on a reply alone: the
replay must act. With `evolver.collective.gate.sandbox` set, a task whose recorded request offered tools
is replayed as an agent loop: the conversation up to the task's last user message (a later tool step's
earlier calls never happened in the sandbox), the offered tools' definitions, the engine's greedy reply;
each tool call is run by the configured tool set in a fresh copy of the workspace as it was when the task
started (the snapshot its check names, `workspace_before` under `snapshot_root`, where the client keeps
one; else the workload's `workspace_src`) and its result sent back, up to `max_steps` rounds; then the reply and the files the replay left go to the grader
(`PRM.grade`, which checks them where the spec's workspace would be). Each replay gets its own folder, so
A and B never see each other's writes and nothing a user owns is touched.

The tool set is named by import path ("module:attribute", the harness's `harness.tools:WORKSPACE_TOOLS`):
the workload's tools live with the workload, above every plane, and the gate runs whatever the operator
configured. Its `run(workspace, name, arguments_json) -> str` must confine itself to `workspace`.
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from core.config import SandboxConfig
from core.contracts import tool_names

# `chat(messages, tools, max_tokens) -> the assistant message` ({"content", "tool_calls"}), greedy
Chat = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, int], Awaitable[dict[str, Any]]]
MAX_RESULT_CHARS = 4000  # of one tool result sent back to the model


class SandboxError(RuntimeError):
    """The sandbox cannot be set up (a bad tool set path) or its result cannot be graded (too large)."""


class ToolSet(Protocol):
    specs: list[dict[str, Any]]

    def run(self, workspace: Path, name: str, arguments: str) -> str: ...


def load_tools(path: str) -> ToolSet:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise SandboxError(f"sandbox.tools must be 'module:attribute', got {path!r}")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise SandboxError(f"sandbox.tools {path!r} cannot be loaded: {e}") from e
    if not isinstance(getattr(obj, "specs", None), list) or not callable(getattr(obj, "run", None)):
        raise SandboxError(f"sandbox.tools {path!r} needs a `specs` list and a `run(workspace, name, args)`")
    return obj


def task_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation up to and including its last user message: the task as the user posed it."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
    return [dict(m) for m in messages[: last + 1]]


def snapshot(ws: Path, max_bytes: int) -> dict[str, bytes]:
    """Every regular file under `ws` by its relative POSIX path (links are not followed)."""
    files: dict[str, bytes] = {}
    total = 0
    for p in sorted(ws.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        data = p.read_bytes()
        total += len(data)
        if total > max_bytes:
            raise SandboxError(f"the replay's workspace exceeds sandbox.max_bytes ({max_bytes})")
        files[p.relative_to(ws).as_posix()] = data
    return files


class Sandbox:
    """The tool set and workspace of `cfg`; `replay` runs one task (module docstring)."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.tools = load_tools(cfg.tools)
        self.src = Path(cfg.workspace_src) if cfg.workspace_src else None
        if self.src is not None and not self.src.is_dir():
            raise SandboxError(f"sandbox.workspace_src {cfg.workspace_src!r} is not a directory")

    def start_for(self, eval_spec: dict[str, Any] | None) -> Path | None:
        """The folder a replay of the task starts from: the snapshot its check names
        (`workspace_before`, confined to `snapshot_root`), else None (`workspace_src`). Raises SandboxError
        for a snapshot that is named but outside the root or gone: the task cannot be replayed faithfully."""
        rel = (eval_spec or {}).get("workspace_before")
        if rel is None or self.cfg.snapshot_root is None:
            return None
        root = Path(self.cfg.snapshot_root).resolve()
        path = (root / str(rel)).resolve()
        if not path.is_relative_to(root) or not path.is_dir():
            raise SandboxError(f"the task's workspace snapshot {rel!r} is not a folder under snapshot_root")
        return path

    def offered(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The tool set's definitions the recorded request offered (by name)."""
        return [s for s in self.tools.specs if set(tool_names([s])) & set(names)]

    def _run_tool(self, ws: Path, call: dict[str, Any]) -> str:
        fn = call.get("function") or {}
        try:
            out = self.tools.run(ws, str(fn.get("name")), fn.get("arguments") or "{}")
        except Exception as e:  # noqa: BLE001 - the model sees a failed tool as an agent would
            out = f"error: {type(e).__name__}: {e}"
        return str(out)[:MAX_RESULT_CHARS]

    async def replay(self, chat: Chat, messages: Sequence[dict[str, Any]], offered: Sequence[str],
                     max_tokens: int, start: Path | None = None) -> tuple[str, dict[str, bytes]]:
        """The final reply of the task replayed with its tools, and the workspace it left; the replay's
        folder starts as a copy of `start` (the task's own snapshot, `start_for`) or of `workspace_src`."""
        specs = self.offered(offered)
        src = start if start is not None else self.src
        with tempfile.TemporaryDirectory(prefix="clawray-sandbox-") as tmp:
            ws = Path(tmp) / "workspace"
            if src is not None:
                await asyncio.to_thread(shutil.copytree, src, ws, symlinks=True)
            ws.mkdir(exist_ok=True)
            msgs, reply = task_messages(messages), ""
            for step in range(self.cfg.max_steps + 1):
                msg = await chat(msgs, specs or None, max_tokens)
                reply, calls = msg.get("content") or "", msg.get("tool_calls") or []
                if not calls or step == self.cfg.max_steps:
                    break
                msgs.append({"role": "assistant", "content": reply, "tool_calls": calls})
                for c in calls:
                    result = await asyncio.to_thread(self._run_tool, ws, c)
                    msgs.append({"role": "tool", "tool_call_id": c.get("id") or "", "content": result})
            return reply, await asyncio.to_thread(snapshot, ws, self.cfg.max_bytes)
