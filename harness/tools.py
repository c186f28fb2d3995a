"""The workload's tools: `write_file` / `read_file`, confined to one workspace folder.

The simulated users' agent loop (harness/driver.py) runs them in each user's workspace; the validation
gate of collective evolution replays recorded tasks with the same tools in a sandbox copy of the
workload's workspace (evolve/sandbox.py, configured as `harness.tools:WORKSPACE_TOOLS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS = [
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a text file in the workspace",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the workspace",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]


def _inside(ws: Path, rel: str) -> Path:
    p = (ws / rel).resolve()
    if not p.is_relative_to(ws.resolve()):
        raise ValueError(f"path {rel!r} escapes the workspace")
    return p


def run_tool(ws: Path, name: str, args_json: str) -> str:
    """Run one tool call in `ws`; a bad call is an `error: …` result the model reads, never an exception."""
    try:
        args = json.loads(args_json or "{}")
        if name == "write_file":
            p = _inside(ws, str(args["path"]))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(str(args.get("content", "")), encoding="utf-8")
            return f"wrote {args['path']}"
        if name == "read_file":
            return _inside(ws, str(args["path"])).read_text(encoding="utf-8")[:2000]
        return f"unknown tool {name}"
    except (ValueError, KeyError, OSError, TypeError) as e:
        return f"error: {e}"


@dataclass(frozen=True)
class ToolSet:
    """What evolve/sandbox.py loads by name: the definitions and the runner."""

    specs: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)

    def run(self, workspace: Path, name: str, arguments: str) -> str:
        return run_tool(workspace, name, arguments)


WORKSPACE_TOOLS = ToolSet()
