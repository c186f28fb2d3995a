"""Load a workload in the MetaClaw-Bench format (days of rounds with programmatic evaluation + feedback).

Layout: `all_tests.json` (`test[]` with `id`, `desc`, `session`, `eval`), `eval/<eval>/questions.json`
(`rounds[]` with `id`, `type` `file_check`|`multi_choice`|<checker>, `question`, `eval`, `feedback`),
optional `workspaces/shared/` (persona files and per-day inputs) copied into each user's workspace.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILTIN_SCRIPTS = {"check_iso8601.py", "check_filename.py", "check_metadata.py", "check_backup.py",
                   "check_done_log.py"}


@dataclass
class Round:
    id: str
    type: str
    question: str
    eval: dict[str, Any]
    feedback: dict[str, Any]

    def eval_spec(self) -> dict[str, Any]:
        """The spec rewards' `evaluate` takes (the round type names the checker)."""
        return {"type": self.type, **self.eval}

    def feedback_text(self, passed: bool, answer: set[str] | None = None) -> str:
        fb = self.feedback or {}
        if passed:
            return str(fb.get("correct", "Correct."))
        if self.type == "multi_choice" and "options" in fb:
            wrong = [t for k, t in sorted(fb["options"].items())
                     if answer is not None and ((k in answer) != (k in self.eval.get("answer", [])))]
            return " ".join(wrong) or str(fb.get("incorrect", "Incorrect."))
        return str(fb.get("incorrect", "Incorrect."))


@dataclass
class Day:
    id: str
    desc: str
    rounds: list[Round]
    skipped: list[str] = field(default_factory=list)  # rounds this copy cannot replay, with reasons


@dataclass
class Workload:
    name: str
    root: Path
    days: list[Day]

    @property
    def workspace_src(self) -> Path | None:
        p = self.root / "workspaces" / "shared"
        return p if p.is_dir() else None

    def persona(self) -> str:
        src = self.workspace_src
        if src is None:
            return ""
        parts = [(src / f).read_text(encoding="utf-8") for f in ("IDENTITY.md", "USER.md") if (src / f).is_file()]
        return "\n\n".join(parts)[:1500]


def replayable(r: Round, workspace_src: Path | None) -> str | None:
    """None if the round can be replayed from this copy, else why not."""
    if r.type != "file_check":
        return None
    cmd = r.eval.get("command")
    if not cmd:
        return "file_check round without a command"
    argv = shlex.split(cmd)
    scripts = [a for a in argv if a.endswith(".py")]
    for s in scripts:
        if Path(s).name in BUILTIN_SCRIPTS:
            continue
        if workspace_src is None or not (workspace_src / s).is_file():
            return f"needs {s}, which this copy of the workload does not ship"
    return None


def load_workload(root: Path, days: list[str] | None = None) -> Workload:
    root = Path(root)
    index = json.loads((root / "all_tests.json").read_text(encoding="utf-8"))
    src = root / "workspaces" / "shared"
    out = []
    for entry in index.get("test", []):
        if days and entry["id"] not in days:
            continue
        q = json.loads((root / "eval" / entry.get("eval", entry["id"]) / "questions.json").read_text("utf-8"))
        rounds, skipped = [], []
        for raw in q["rounds"]:
            r = Round(raw["id"], raw["type"], raw["question"], raw.get("eval", {}), raw.get("feedback", {}))
            why = replayable(r, src if src.is_dir() else None)
            (skipped.append(f"{r.id}: {why}") if why else rounds.append(r))
        out.append(Day(entry["id"], entry.get("desc", q.get("desc", "")), rounds, skipped))
    return Workload(index.get("name", root.name), root, out)
