"""Simulated users: play a workload's days through the proxy with the official OpenAI SDK.

Each (user, day) is one session: every round's question is sent (prefixed with `[Previous Feedback] …`
like MetaClaw-Bench), the reply is scored with the rewards plane's checkers (file rounds run against the
user's own workspace, where the model's `write_file` tool calls are executed, confined to that folder),
and the feedback becomes the next state. The session ends with `X-Session-Done`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.tools import TOOLS, run_tool
from harness.workload import Day, Round, Workload
from rewards.checkers import CheckerSpecError, evaluate
from rewards.checkers.choice import parse_choices

MAX_TOOL_STEPS = 2


@dataclass
class RoundResult:
    user: str
    day: str
    round: str
    session_id: str
    score: float
    passed: bool
    reply: str
    seconds: float
    error: str | None = None


def prepare_workspace(workload: Workload, root: Path, user: str) -> Path:
    """A private copy of the workload's shared workspace for `user` (fresh each run)."""
    ws = root / user
    if ws.exists():
        shutil.rmtree(ws)
    if workload.workspace_src is not None:
        shutil.copytree(workload.workspace_src, ws)
    ws.mkdir(parents=True, exist_ok=True)
    return ws


SNAPSHOTS = ".snapshots"  # under the workspace root: each file task's starting files (the gate replays from them)


def snapshot_workspace(ws_root: Path, user: str, session: str, round_id: str) -> str:
    """Copy `user`'s workspace as it is when a file task starts; the copy's path relative to `ws_root`,
    which the round's check carries as `workspace_before` (evolve/sandbox.py replays the task from it:
    earlier rounds of the day may have changed the files since the workload's own copy)."""
    rel = Path(SNAPSHOTS) / session / round_id
    dst = ws_root / rel
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(ws_root / user, dst, symlinks=True)
    return rel.as_posix()


def score_round(r: Round, reply: str, ws_root: Path, user: str) -> tuple[float, bool, str]:
    spec = {**r.eval_spec(), "workspace": user}
    try:
        res = evaluate(spec, reply, ws_root)
    except CheckerSpecError as e:
        return 0.0, False, f"cannot evaluate: {e}"
    letters = set((r.eval.get("options") or {}).keys())
    answer = set(parse_choices(reply, letters) or []) if r.type == "multi_choice" else None
    return float(res.score), bool(res.passed), r.feedback_text(bool(res.passed), answer)


def request_seed(session: str, round_id: str, step: int) -> int:
    """A fixed sampling seed per (session, round, tool step): a replay of the same workload samples the
    same replies from the same prompts, so the demo's runs are reproducible on one machine."""
    return zlib.crc32(f"{session}/{round_id}/{step}".encode()) & 0x7FFFFFFF


async def play_day(client: Any, workload: Workload, day: Day, user: str, ws_root: Path, *, model: str,
                   max_tokens: int, history_rounds: int = 1, on_result: Callable | None = None,
                   run_tag: str = "") -> list[RoundResult]:
    session = f"{user}-{day.id}{run_tag}"
    headers = {"X-Session-Id": session, "X-User-Id": user}
    system = {"role": "system", "content": workload.persona() or "You are a helpful assistant."}
    history: list[dict[str, Any]] = []
    feedback, results = "", []
    for i, r in enumerate(day.rounds):
        last = i == len(day.rounds) - 1
        question = (f"[Previous Feedback] {feedback}\n\n" if feedback else "") + r.question
        history.append({"role": "user", "content": question})
        t0, reply, err = time.time(), "", None
        spec = {**r.eval_spec(), "workspace": user}
        if r.type == "file_check":
            spec["workspace_before"] = snapshot_workspace(ws_root, user, session, r.id)
        try:
            for step in range(MAX_TOOL_STEPS + 1):
                msgs = [system, *history[-(2 * history_rounds + 1 + 2 * step):]]
                resp = await client.chat.completions.create(
                    model=model, messages=msgs, max_tokens=max_tokens, temperature=1.0,
                    seed=request_seed(session, r.id, step),
                    tools=TOOLS if r.type == "file_check" else None,
                    extra_headers={**headers, **({"X-Session-Done": "true"} if last and step == MAX_TOOL_STEPS else {})},
                    extra_body={"clawray_eval": spec})
                msg = resp.choices[0].message
                reply = msg.content or ""
                calls = msg.tool_calls or []
                history.append({"role": "assistant", "content": reply,
                                **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
                if not calls or step == MAX_TOOL_STEPS:
                    break
                ws = ws_root / user
                for c in calls:
                    history.append({"role": "tool", "tool_call_id": c.id,
                                    "content": run_tool(ws, c.function.name, c.function.arguments)})
        except Exception as e:  # noqa: BLE001 - a failed request is a result (counted), not a crash
            err = f"{type(e).__name__}: {e}"
        score, passed, feedback = score_round(r, reply, ws_root, user)
        res = RoundResult(user, day.id, r.id, session, score, passed, reply[:200], time.time() - t0, err)
        results.append(res)
        if on_result:
            on_result(res)
    await _end_session(client, session, headers)
    return results


async def _end_session(client: Any, session: str, headers: dict[str, str]) -> None:
    try:
        await client.post(f"/sessions/{session}/end", cast_to=object, body={}, options={"headers": headers})
    except Exception:  # noqa: BLE001 - ending is best effort; the idle timeout flushes otherwise
        pass


async def run_day(base_url: str, workload: Workload, day: Day, users: list[str], ws_root: Path, *,
                  model: str = "clawray-policy", max_tokens: int = 24, api_key: str = "unused",
                  on_result: Callable | None = None, run_tag: str = "") -> list[RoundResult]:
    """All `users` play `day` concurrently (one session each)."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=2,
                                timeout=120)
    try:
        per_user = await asyncio.gather(*(
            play_day(client, workload, day, u, ws_root, model=model, max_tokens=max_tokens,
                     on_result=on_result, run_tag=run_tag) for u in users))
    finally:
        await client.close()
    return [r for rs in per_user for r in rs]


def summarize(results: list[RoundResult]) -> dict[str, Any]:
    n = len(results)
    return {"rounds": n, "mean_score": sum(r.score for r in results) / n if n else 0.0,
            "passed": sum(r.passed for r in results), "errors": sum(r.error is not None for r in results)}


def dump(results: list[RoundResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(asdict(r)) for r in results) + "\n")
