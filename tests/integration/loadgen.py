"""Steady load for the reliability and concurrency tests, with every request accounted for.

Simulated users play sessions of the `clawray-mini` workload through the proxy with the official OpenAI
SDK, like `harness/driver.py` (session headers, the round's `clawray_eval` spec so the PRM scores every
turn, the checker's feedback as the next state, `X-Session-Done` on the last round), in a background
thread with its own event loop. Unlike the driver they never retry (`max_retries=0`) and log every
request (times, status, serving replica, reply text), so a test can tell what the client saw succeed from
what it saw fail. Helpers read the sessions DB (read-only) and ask `Replay` which turns became samples.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import shutil
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import ray

from core.config import REPO_ROOT
from harness.driver import score_round
from harness.workload import Round, load_workload

WORKLOAD = REPO_ROOT / "workloads" / "clawray-mini"


@dataclass
class Req:
    user: str
    session: str
    t0: float  # epoch seconds, sent
    t1: float  # epoch seconds, answered or failed
    status: int | None  # HTTP status; None when no response came (connection refused/reset, timeout)
    replica: str | None = None  # X-Clawray-Replica of the answer
    text: str | None = None  # the reply the client got (200 only)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def rounds() -> list[Round]:
    """The workload's rounds that need no tools (file rounds need a workspace and several requests)."""
    days = load_workload(WORKLOAD).days
    return [r for d in days for r in d.rounds if r.type != "file_check"]


@dataclass
class Load:
    """`users` concurrent simulated users, each playing sessions of `rounds_per_session` rounds.

    `stream_users` of them stream their replies (real SSE through the proxy), the rest do not.
    """

    base_url: str
    tag: str
    users: int = 3
    rounds_per_session: int = 3
    pause_s: float = 0.2
    max_tokens: int = 8
    stream_users: int = 1
    requests: list[Req] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    end_failures: int = 0

    def __post_init__(self) -> None:
        self.crashed: Exception | None = None
        self._stopped = False
        self._rounds = rounds()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ws = Path(tempfile.mkdtemp(prefix="clawray-load-"))

    # ---- control ----------------------------------------------------------------------------------

    def start(self) -> Load:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True,
                                        name=f"load-{self.tag}")
        self._thread.start()
        return self

    def stop(self, timeout: float = 120.0) -> None:
        """Stop after the requests in flight; every session started is ended (flushing its last turn)."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            assert not self._thread.is_alive(), "load thread did not stop"
        self._end_all()
        shutil.rmtree(self._ws, ignore_errors=True)
        self.check()

    def check(self) -> None:
        """Raise if the load itself broke (a bug in the users, not a failed request)."""
        if self.crashed is not None:
            raise AssertionError(f"the load generator crashed: {self.crashed!r}") from self.crashed

    def snapshot(self) -> list[Req]:
        return list(self.requests)  # appends happen on the load thread; a copy is a consistent prefix

    def between(self, t0: float, t1: float) -> list[Req]:
        """Requests in flight at some time in [t0, t1]."""
        return [r for r in self.snapshot() if r.t0 <= t1 and r.t1 >= t0]

    # ---- the users --------------------------------------------------------------------------------

    async def _main(self) -> None:
        client = openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0,
                                    timeout=60)
        try:
            await asyncio.gather(*(self._user(client, f"u{i}", stream=i < self.stream_users)
                                   for i in range(self.users)))
        except Exception as e:  # noqa: BLE001 - kept for check(): a crashed load must fail the test
            self.crashed = e
            self._stop.set()
        finally:
            await client.close()

    async def _user(self, client: openai.AsyncOpenAI, user: str, stream: bool) -> None:
        pool = itertools.cycle(self._rounds)
        for k in itertools.count():
            if self._stop.is_set():
                return
            session = f"{self.tag}-{user}-{k}"
            self.sessions.append(session)
            history: list[dict[str, Any]] = []
            feedback = ""
            for i in range(self.rounds_per_session):
                r = next(pool)
                last = i == self.rounds_per_session - 1 or self._stop.is_set()
                question = (f"[Previous Feedback] {feedback}\n\n" if feedback else "") + r.question
                history.append({"role": "user", "content": question})
                req = await self._send(client, user, session, history[-3:], r, last, stream)
                history.append({"role": "assistant", "content": req.text or ""})
                _, _, feedback = score_round(r, req.text or "", self._ws, user)
                if last:
                    break
                await asyncio.sleep(self.pause_s)
            await self._end(session)

    async def _send(self, client, user: str, session: str, messages: list[dict], r: Round, last: bool,
                    stream: bool) -> Req:
        headers = {"X-Session-Id": session, "X-User-Id": user, **({"X-Session-Done": "true"} if last else {})}
        spec = {**r.eval_spec(), "workspace": user}
        req = Req(user, session, time.time(), 0.0, None)
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="clawray-policy", messages=[{"role": "system", "content": "You are a helpful assistant."},
                                                  *messages],
                max_tokens=self.max_tokens, temperature=1.0, stream=stream, extra_headers=headers,
                extra_body={"clawray_eval": spec})
            req.status, req.replica = raw.status_code, raw.headers.get("x-clawray-replica")
            body = raw.parse()  # a stream parses at once; a plain reply is a coroutine
            body = await body if inspect.isawaitable(body) else body
            if stream:
                parts = [c.choices[0].delta.content or "" async for c in body if c.choices]
                req.text = "".join(parts)
            else:
                req.text = body.choices[0].message.content or ""
        except openai.APIStatusError as e:
            req.status, req.error = e.status_code, f"{type(e).__name__}: {e.message[:120]}"
        except (openai.APIError, httpx.HTTPError) as e:
            # No response (status stays None), or a stream that broke or carried an in-band error
            # event after its 200 headers: either way a failure the client saw.
            req.error, req.text = f"{type(e).__name__}: {str(e)[:120]}", None
        req.t1 = time.time()
        self.requests.append(req)
        return req

    async def _end(self, session: str) -> None:
        try:
            async with httpx.AsyncClient(timeout=30) as c:
                (await c.post(f"{self.base_url}/v1/sessions/{session}/end", json={})).raise_for_status()
        except httpx.HTTPError:
            self.end_failures += 1  # ended again by `stop()`; the end route is idempotent

    def _end_all(self, attempts: int = 30) -> None:
        todo = list(self.sessions)
        for _ in range(attempts):
            failed = []
            for s in todo:
                try:
                    httpx.post(f"{self.base_url}/v1/sessions/{s}/end", json={}, timeout=30).raise_for_status()
                except httpx.HTTPError:
                    failed.append(s)
            if not failed:
                return
            todo = failed
            time.sleep(1)
        raise AssertionError(f"could not end {len(todo)} sessions")


# ---- what the system holds ----------------------------------------------------------------------------

@dataclass
class DbTurn:
    turn_id: str
    session_id: str
    turn_index: int
    state: str  # pending | completed | dispatched
    attempts: int  # outbox deliveries tried (> 1: re-delivered after a failure)
    text: str
    next_state: Any
    messages: list[dict[str, Any]]


def db_turns(db_path: Path, prefix: str) -> list[DbTurn]:
    """Turns of sessions whose id starts with `prefix` (read-only; the proxies write it concurrently)."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute(
            "SELECT t.turn_id, session_id, turn_index, state, attempts, COALESCE(NULLIF(t.payload, ''), p.payload), "
            "next_state FROM turns t LEFT JOIN payloads p ON p.turn_id = t.turn_id "  # serve/sessions.py `payloads`
            "WHERE session_id LIKE ? ORDER BY session_id, turn_index", (prefix + "%",)).fetchall()
    finally:
        db.close()
    out = []
    for tid, sid, idx, state, attempts, payload, nxt in rows:
        p = json.loads(payload)  # the next state has its own column (serve/sessions.py)
        out.append(DbTurn(tid, sid, idx, state, attempts, p.get("response_text") or "",
                          json.loads(nxt) if nxt is not None else p.get("next_state"), p.get("messages") or []))
    return out


def in_replay(replay: Any, ids: list[str], chunk: int = 500) -> dict[str, str]:
    """sample_id -> state for the ids `Replay` holds (sample_id == turn_id)."""
    out: dict[str, str] = {}
    for i in range(0, len(ids), chunk):
        out.update(ray.get(replay.states.remote(ids[i:i + chunk]), timeout=60))
    return out


def alive_pids(name: str | None = None, class_name: str | None = None) -> list[int]:
    """Pids of ALIVE actors with this name or class (from the GCS actor table).

    NOTE: `ray.util.state.list_actors` needs the dashboard, which the test cluster does not start (and
    without an address it may pick another cluster on this shared machine); the GCS table is ours.
    """
    table = ray._private.state.actors(actor_state_name="ALIVE").values()
    return sorted(a["Pid"] for a in table
                  if (name is None or a["Name"] == name) and (class_name is None or class_name in a["ActorClassName"])
                  and a["Pid"])


def ingress_class(cfg) -> str:
    """Ray actor class of the main app's replicas that serve HTTP (the Proxy's code): `Proxy`, or the
    engine's deployment when `proxy.colocate` puts both in one replica."""
    return f"ServeReplica:clawray:{'PolicyEngine' if cfg.proxy.colocate else 'Proxy'}"
