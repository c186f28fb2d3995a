"""Evidence for collective evolution: one row per scored main turn, from every user and tenant.

The `Evolver` actor appends a row for each scored main turn it observes (the PRM tells it about every
one); the collective job (evolve/collective_job.py) reads them by sequence number. A row keeps what the
job needs to judge a skill and to replay the task: the skills injected into the turn and the skills the
agent read or modified through its tools (a tool call whose arguments name `<name>/SKILL.md` of a known
skill), its score, the last user message, the reply, what followed it (the next state), the programmatic
check the client sent, and the request's messages with the injected skills block taken out (the gate
injects the current or the candidate version in its place).

Embedded default: the SQLite file `<storage root>/skills-evidence/evidence.db` (never inside the skills
folder, which is mirrored to object storage); with `state.dsn`: the PostgreSQL schema
`<namespace>_evidence`. Appends are idempotent by turn id (the outbox may deliver a turn twice).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from core.agent_context import AGENT_CONTEXT_MARKERS, latest_user_words
from core.config import StateConfig
from core.contracts import Sample, Turn
from core.state import open_database

STORE = "evidence"
EVIDENCE_DIR = "skills-evidence"
EVIDENCE_FILE = "evidence.db"
SKILLS_HEADER = "## Active Skills"  # evolve/retrieval.py render_skills_block's first line
MAX_TEXT = 4000  # characters kept of the instruction, reply and feedback

SCHEMA = """
CREATE TABLE IF NOT EXISTS evidence (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    reward REAL NOT NULL,
    record TEXT NOT NULL            -- Evidence as JSON
);
CREATE INDEX IF NOT EXISTS evidence_session ON evidence(session_id);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    job TEXT NOT NULL,
    skill TEXT NOT NULL,            -- '' for a create decision's new name until it has one
    action TEXT NOT NULL,           -- refine | create | optimize_description | skip
    published INTEGER NOT NULL,     -- 1: a new version was written
    record TEXT NOT NULL            -- the decision, its edit summary and the gate's verdict as JSON
)"""


class Evidence(BaseModel):
    """What one scored main turn tells collective evolution."""

    turn_id: str
    session_id: str
    tenant: str = "default"
    turn_index: int = 0
    created_at: float = Field(default_factory=time.time)
    reward: float
    skills: list[str] = Field(default_factory=list)  # injected into the turn
    touched: list[str] = Field(default_factory=list)  # read or modified through the agent's tools
    tools: list[str] = Field(default_factory=list)  # the tools its request offered (the gate replays with them)
    instruction: str = ""
    response: str = ""
    feedback: str = ""
    eval_spec: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)  # the request, skills block removed
    skill_generation: int = 0

    @property
    def used(self) -> list[str]:
        """Skills the turn used: injected or touched, each once, in that order."""
        return list(dict.fromkeys([*self.skills, *self.touched]))

    @property
    def failed(self) -> bool:
        return self.reward <= 0


def _text(content: Any) -> str:
    """Message content as plain text: a string, or OpenAI / Anthropic content parts (text parts and the
    nested content of Anthropic `tool_result` parts; a `text` that is not a string is no text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p.get("text"), str) else _text(p.get("content"))
                 for p in content if isinstance(p, dict)]
        return "\n".join(p for p in parts if p)
    return ""


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def strip_skills_block(text: str) -> str:
    """`text` without the skills block the Proxy appended (it runs to the next `## ` block the Proxy
    appends after it, the memory block, or to the end)."""
    start = text.find(SKILLS_HEADER)
    if start < 0:
        return text
    nxt = text.find("\n## Memory", start + len(SKILLS_HEADER))
    head = text[:start].rstrip("\n")
    tail = text[nxt:].lstrip("\n") if nxt >= 0 else ""
    return "\n\n".join(p for p in (head, tail) if p)


def strip_injection(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the injected skills block removed from the leading system message (a system
    message that held only the block is dropped)."""
    out = [dict(m) for m in messages]
    if not out or out[0].get("role") not in ("system", "developer"):
        return out
    content = out[0].get("content")
    if isinstance(content, str):
        stripped = strip_skills_block(content)
    elif isinstance(content, list):
        parts = [p for p in content if not (isinstance(p, dict) and isinstance(p.get("text"), str)
                                            and p["text"].startswith(SKILLS_HEADER))]
        stripped = parts if parts else ""
    else:
        return out
    if not stripped:
        return out[1:]
    out[0]["content"] = stripped
    return out


_SKILL_PATH_RE = re.compile(r"([a-z0-9][a-z0-9-]{1,63})[/\\]+SKILL\.md", re.I)


def touched_skills(tool_calls: Iterable[dict[str, Any]], known: Iterable[str]) -> list[str]:
    """Skills of `known` whose SKILL.md a tool call names in its arguments (read, edited, written)."""
    names = set(known)
    found: list[str] = []
    for call in tool_calls:
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        args = fn.get("arguments", fn.get("input", ""))
        text = args if isinstance(args, str) else json.dumps(args)
        for m in _SKILL_PATH_RE.finditer(text):
            if m.group(1) in names and m.group(1) not in found:
                found.append(m.group(1))
    return found


def turn_texts(turn: Turn, markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> tuple[str, str, str]:
    """(the instruction the turn answered, the reply with its tool calls rendered, the next state) of a turn
    as text: what the evolvers read (evolve/loop.py `failure_from`) and the evidence rows keep. The
    instruction is the user's latest own words (core/agent_context.py): in an agent's tool loop that is the
    request the loop works on, not the tool result or the agent's reminders in the last user message; a
    conversation with no words of the user's reads its last user message whole (a tool result's text too)."""
    instruction = latest_user_words(turn.messages, markers) or _text(
        next((m for m in reversed(turn.messages) if m.get("role") == "user"), {}).get("content"))
    feedback = "\n".join(_text(m.get("content")) for m in (turn.next_state or []))
    response = turn.response_text
    if turn.tool_calls:
        response += "\n[tool calls] " + "; ".join(
            str((c.get("function") or {}).get("name", "")) + str((c.get("function") or {}).get("arguments", ""))
            for c in turn.tool_calls)
    return instruction, response, feedback


def evidence_from(turn: Turn, sample: Sample, known: Iterable[str],
                  markers: tuple[str, ...] = AGENT_CONTEXT_MARKERS) -> Evidence:
    """The evidence row of one scored main turn (`markers`: what in a user message is the agent's)."""
    instruction, response, feedback = turn_texts(turn, markers)
    return Evidence(turn_id=turn.turn_id, session_id=turn.session_id, tenant=turn.tenant,
                    turn_index=turn.turn_index, created_at=turn.created_at, reward=float(sample.reward),
                    skills=list(turn.skills), touched=touched_skills(turn.tool_calls, known), tools=list(turn.tools),
                    instruction=_cut(instruction), response=_cut(response),
                    feedback=_cut(feedback), eval_spec=turn.eval_spec,
                    # Only a turn with a check can be replayed by the gate: keep the (possibly long) request
                    # of those alone, so real agents' 20k-token prompts do not fill the store.
                    messages=strip_injection(turn.messages) if turn.eval_spec else [],
                    skill_generation=turn.skill_generation)


class EvidenceStore:
    """Evidence rows and the collective job's decisions (module docstring)."""

    def __init__(self, storage_root: str | Path, state: StateConfig | dict | None = None) -> None:
        cfg = StateConfig.model_validate(state) if isinstance(state, dict) else state
        root = Path(storage_root)
        path = root / EVIDENCE_DIR / EVIDENCE_FILE
        if cfg is None or not cfg.dsn:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.db = open_database(cfg, path, STORE, storage_root=root)
        self.db.schema(SCHEMA)

    def append(self, rows: Sequence[Evidence]) -> int:
        """Store `rows` (a turn id already stored is skipped); returns how many were new."""
        new = 0
        with self.db.tx() as c:
            for e in rows:
                n = c.execute("INSERT INTO evidence(turn_id, session_id, tenant, created_at, reward, record) "
                              "VALUES(?, ?, ?, ?, ?, ?) ON CONFLICT (turn_id) DO NOTHING",
                              (e.turn_id, e.session_id, e.tenant, e.created_at, e.reward,
                               e.model_dump_json())).rowcount
                new += max(n, 0)
        return new

    def since(self, seq: int, limit: int = 10_000) -> list[tuple[int, Evidence]]:
        """Rows after sequence number `seq`, oldest first, at most `limit`."""
        with self.db.tx() as c:
            rows = c.execute("SELECT seq, record FROM evidence WHERE seq > ? ORDER BY seq LIMIT ?",
                             (seq, limit)).fetchall()
        return [(int(s), Evidence.model_validate_json(r)) for s, r in rows]

    def of_sessions(self, sessions: Sequence[str], limit: int = 10_000) -> list[Evidence]:
        """The rows of `sessions`, oldest first, at most `limit`."""
        ids = list(dict.fromkeys(sessions))
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        with self.db.tx() as c:
            rows = c.execute(f"SELECT record FROM evidence WHERE session_id IN ({marks}) ORDER BY seq LIMIT ?",
                             (*ids, limit)).fetchall()
        return [Evidence.model_validate_json(r) for (r,) in rows]

    def last_seq(self) -> int:
        with self.db.tx() as c:
            row = c.execute("SELECT MAX(seq) FROM evidence").fetchone()
        return int(row[0] or 0)

    def sample_outside(self, sessions: Iterable[str], n: int, before_seq: int | None = None) -> list[Evidence]:
        """Up to `n` replayable rows (with an eval spec) of OTHER sessions, newest first: the held-back
        tasks a candidate must not hurt."""
        if n <= 0:
            return []
        excluded = set(sessions)
        bound = before_seq if before_seq is not None else self.last_seq()
        with self.db.tx() as c:
            rows = c.execute("SELECT session_id, record FROM evidence WHERE seq <= ? ORDER BY seq DESC LIMIT ?",
                             (bound, 50 * n + len(excluded))).fetchall()
        out: list[Evidence] = []
        for sid, rec in rows:
            if sid in excluded:
                continue
            e = Evidence.model_validate_json(rec)
            if e.eval_spec and e.messages:
                out.append(e)
                if len(out) >= n:
                    break
        return out

    def prune(self, before: float, upto_seq: int, decisions_before: float | None = None) -> int:
        """Delete evidence older than `before` (epoch s) that a job has read (seq <= `upto_seq`), and
        decisions older than `decisions_before` (None: none, the audit log is kept); returns the evidence
        rows deleted."""
        with self.db.tx() as c:
            n = c.execute("DELETE FROM evidence WHERE created_at < ? AND seq <= ?", (before, upto_seq)).rowcount
            if decisions_before is not None:
                c.execute("DELETE FROM decisions WHERE ts < ?", (decisions_before,))
        return max(n, 0)

    def record_decision(self, job: str, skill: str, action: str, published: bool, record: dict[str, Any]) -> None:
        with self.db.tx() as c:
            c.execute("INSERT INTO decisions(ts, job, skill, action, published, record) VALUES(?, ?, ?, ?, ?, ?)",
                      (time.time(), job, skill, action, int(published), json.dumps(record, default=str)))

    def decisions(self, limit: int = 50) -> list[dict[str, Any]]:
        """The most recent decisions, newest first."""
        with self.db.tx() as c:
            rows = c.execute("SELECT ts, job, skill, action, published, record FROM decisions "
                             "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [{"ts": float(ts), "job": job, "skill": skill, "action": action, "published": bool(pub),
                 **json.loads(rec)} for ts, job, skill, action, pub, rec in rows]

    def close(self) -> None:
        self.db.close()
