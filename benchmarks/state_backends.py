"""State backends: Replay durable append and lease throughput, session turn-commit latency, SQLite and
PostgreSQL in the same run.

    python -m benchmarks.state_backends [--samples 20000] [--batch 256] [--lease-batch 64]
                                        [--prompt-tokens 512] [--response-tokens 128]
                                        [--sessions 64] [--turns 8] [--quick]

Both backends run the stores' real code paths (train/replay_store.py, serve/sessions.py on core/db.py):
SQLite files in a temp folder (Replay with `synchronous=FULL`: every commit fsynced, ack == durable;
sessions with `NORMAL`, as in production), and a private PostgreSQL 16 that the benchmark starts with
`pgserver` over its Unix socket (default durability: `synchronous_commit=on`, fsync on). Measured:

- Replay append: `append` of batches of `--batch` samples (the Replay actor's group commit), samples/s
  and per-batch p50/p99; and one sample per call (latency of an unbatched durable append).
- Replay lease cycle: a training step's store calls, `lease(--lease-batch)` -> `seal` -> `commit`, until
  the buffer is drained: samples/s through the cycle and the lease call's p50/p99.
- Session turn commit: `SessionStore.record_batch` as the Proxy's group commit calls it, `--sessions`
  conversations of `--turns` turns each (every request completes its session's previous turn): one
  request per commit (p50/p99 latency: what a request waits for its turn to be durable) and all sessions'
  requests of a round in one commit (turns/s).

Samples carry `--prompt-tokens` prompt ids, `--response-tokens` response ids with logprobs and a loss mask
(~5.5 KB of JSON each at the defaults). Goal: SQLite >= 5,000 samples/s appended durably in batches.
Prints a table, writes benchmarks/out/state_backends.json and .md (benchmarks/report.py shows the .md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from core.config import StateConfig
from core.contracts import Sample, Turn
from core.state import mount_fs_type
from serve.history import History, read_history
from serve.sessions import SessionStore
from train.replay_store import ReplayStore

OUT = Path(__file__).resolve().parent / "out" / "state_backends.json"
GOAL_SQLITE_APPEND = 5000.0  # samples/s, appended durably in batches
BACKENDS = ("sqlite", "postgresql")


def pct(xs: list[float]) -> dict[str, float]:
    """p50/p99/mean of durations in seconds, as milliseconds."""
    s = sorted(xs)
    return {"p50_ms": s[len(s) // 2] * 1e3, "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3,
            "mean_ms": statistics.fmean(s) * 1e3, "n": len(s)}


def postgres(tmp: Path):
    """A private PostgreSQL server for the run (the one the tests start: tests/servers.py); its DSN."""
    from tests.servers import postgres as server

    (tmp / "pg").mkdir()
    return server(tmp / "pg")


def make_samples(n: int, prompt: int, response: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    return [Sample(session_id=f"s{i % 97}", turn_index=i, prompt_ids=[rng.randrange(32000) for _ in range(prompt)],
                   response_ids=[rng.randrange(32000) for _ in range(response)],
                   response_logprobs=[-rng.random() * 4 for _ in range(response)], reward=rng.choice((-1.0, 1.0)),
                   loss_mask=[1] * response, skill_generation=0) for i in range(n)]


def bench_replay(open_store: Callable[[], ReplayStore], samples: list[Sample], batch: int, lease_batch: int,
                 singles: int) -> dict[str, Any]:
    store = open_store()
    try:
        lat = []
        t0 = time.perf_counter()
        for i in range(0, len(samples), batch):
            t = time.perf_counter()
            store.append(samples[i:i + batch])
            lat.append(time.perf_counter() - t)
        append_s = time.perf_counter() - t0
        one = make_samples(singles, 8, 8, seed=1)
        single = []
        for s in one:
            t = time.perf_counter()
            store.append([s])
            single.append(time.perf_counter() - t)
        leased, lease_lat = 0, []
        t0 = time.perf_counter()
        while True:
            t = time.perf_counter()
            lease_id, got = store.lease(lease_batch, owner="bench")
            lease_lat.append(time.perf_counter() - t)
            if lease_id is None:
                break
            ok, why = store.seal(lease_id, [s.sample_id for s in got])
            if not ok:
                raise RuntimeError(f"seal refused: {why}")
            leased += store.commit(lease_id)
        cycle_s = time.perf_counter() - t0
    finally:
        store.close()
    return {"append": {"batch": batch, "samples": len(samples), "samples_per_s": len(samples) / append_s,
                       "batch_latency": pct(lat)},
            "append_single": {"latency": pct(single)},
            "lease_cycle": {"lease_batch": lease_batch, "samples": leased, "samples_per_s": leased / cycle_s,
                            "lease_latency": pct(lease_lat[:-1] or lease_lat)}}


def conversations(n_sessions: int, turns: int) -> list[list[tuple[list[Turn], History]]]:
    """Round k: every session's k-th request (its history continues the session's previous turn)."""
    rounds = []
    for k in range(turns):
        items = []
        for s in range(n_sessions):
            msgs: list[dict[str, Any]] = []
            for j in range(k + 1):
                msgs.append({"role": "user", "content": f"session {s} question {j} " + "lorem ipsum " * 20})
                if j < k:
                    msgs.append({"role": "assistant", "content": f"answer {s}.{j}"})
            turn = Turn(session_id=f"bench-{s}", turn_index=0, prompt_ids=list(range(256)),
                        response_ids=list(range(64)), response_logprobs=[-0.5] * 64, response_text=f"answer {s}.{k}")
            items.append(([turn], read_history(msgs)))
        rounds.append(items)
    return rounds


def bench_sessions(open_store: Callable[[], SessionStore], n_sessions: int, turns: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("one_per_commit", "group_commit"):
        store = open_store()
        try:
            lat, rounds = [], conversations(n_sessions, turns)  # histories hashed before timing
            t0 = time.perf_counter()
            for items in rounds:
                batches = [[x] for x in items] if mode == "one_per_commit" else [items]
                for b in batches:
                    t = time.perf_counter()
                    store.record_batch(b)
                    lat.append(time.perf_counter() - t)
            total_s = time.perf_counter() - t0
        finally:
            store.close()
        out[mode] = {"turns": n_sessions * turns, "turns_per_s": n_sessions * turns / total_s,
                     "commit_latency": pct(lat), "requests_per_commit": 1 if mode == "one_per_commit" else n_sessions}
    return out


def factories(backend: str, dsn: str, tmp: Path) -> tuple[Callable[[], ReplayStore], Callable[[], SessionStore]]:
    """Openers of a fresh, empty store of each kind on `backend` (a new file, or a new namespace)."""
    def state() -> StateConfig | None:
        return StateConfig(dsn=dsn, namespace=f"bench_{uuid.uuid4().hex[:8]}") if backend == "postgresql" else None

    def replay() -> ReplayStore:
        return ReplayStore(tmp / f"replay-{uuid.uuid4().hex}.sqlite", state=state())

    def sessions() -> SessionStore:
        return SessionStore(tmp / f"sessions-{uuid.uuid4().hex}.db", state())

    return replay, sessions


def run(args: argparse.Namespace) -> dict[str, Any]:
    samples = make_samples(args.samples, args.prompt_tokens, args.response_tokens)
    payload = len(samples[0].model_dump_json())
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "quick"} | {"sample_json_bytes": payload},
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0]},
    }
    with tempfile.TemporaryDirectory(prefix="state-bench-") as d:
        tmp = Path(d)
        with postgres(tmp) as dsn:
            # The server shares the CPU cores with the benchmark: its work is in the same budget.
            result["machine"] |= {"postgresql": "16 (pgserver, same host, Unix socket)",
                                  "sqlite_fs": mount_fs_type(tmp)}
            for backend in BACKENDS:
                replay, sessions = factories(backend, dsn, tmp)
                result[backend] = {"replay": bench_replay(replay, samples, args.batch, args.lease_batch, args.singles),
                                   "sessions": bench_sessions(sessions, args.sessions, args.turns)}
    rate = result["sqlite"]["replay"]["append"]["samples_per_s"]
    result["goal"] = {"sqlite_append_samples_per_s": GOAL_SQLITE_APPEND, "measured": rate, "met": rate >= GOAL_SQLITE_APPEND}
    result["machine"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    return result


ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("Replay append, batches of {batch}: samples/s", lambda b: f"{b['replay']['append']['samples_per_s']:,.0f}"),
    ("Replay append, batch latency p50 / p99 ms", lambda b: _lat(b["replay"]["append"]["batch_latency"])),
    ("Replay append, one sample per call: p50 / p99 ms", lambda b: _lat(b["replay"]["append_single"]["latency"])),
    ("Replay lease -> seal -> commit, leases of {lease_batch}: samples/s",
     lambda b: f"{b['replay']['lease_cycle']['samples_per_s']:,.0f}"),
    ("Replay lease call p50 / p99 ms", lambda b: _lat(b["replay"]["lease_cycle"]["lease_latency"])),
    ("Session turn commit, one request per commit: p50 / p99 ms",
     lambda b: _lat(b["sessions"]["one_per_commit"]["commit_latency"])),
    ("Session turns/s, one request per commit", lambda b: f"{b['sessions']['one_per_commit']['turns_per_s']:,.0f}"),
    ("Session turns/s, group commit of {sessions} requests",
     lambda b: f"{b['sessions']['group_commit']['turns_per_s']:,.0f}"),
    ("Session group commit latency p50 / p99 ms", lambda b: _lat(b["sessions"]["group_commit"]["commit_latency"])),
]


def _lat(p: dict[str, float]) -> str:
    return f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f}"


def rows(result: dict[str, Any]) -> list[list[str]]:
    cfg = result["config"]
    return [[label.format(**cfg), *(cell(result[b]) for b in BACKENDS)] for label, cell in ROWS]


def markdown(result: dict[str, Any]) -> str:
    cfg, goal = result["config"], result["goal"]
    lines = ["| measurement | SQLite | PostgreSQL |", "|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows(result)]
    lines += ["", f"{cfg['samples']:,} samples of {cfg['prompt_tokens']}+{cfg['response_tokens']} tokens "
              f"({cfg['sample_json_bytes']:,} bytes of JSON each); {cfg['sessions']} sessions x {cfg['turns']} "
              f"turns. Goal: SQLite >= {goal['sqlite_append_samples_per_s']:,.0f} samples/s appended durably "
              f"in batches: {'met' if goal['met'] else 'NOT met'} ({goal['measured']:,.0f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=256, help="samples per durable append")
    ap.add_argument("--singles", type=int, default=200, help="one-sample appends timed for latency")
    ap.add_argument("--lease-batch", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--response-tokens", type=int, default=128)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="smoke run: 3,000 samples, 16 sessions x 4 turns")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.singles, args.sessions, args.turns = 3000, 50, 16, 4
    result = run(args)
    t = Table(title="state backends (same run)")
    for col in ("measurement", *BACKENDS):
        t.add_column(col, justify="left" if col == "measurement" else "right")
    for r in rows(result):
        t.add_row(*r)
    console = Console(width=130)
    console.print(t)
    console.print(markdown(result).splitlines()[-1])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    OUT.with_suffix(".md").write_text(markdown(result))
    console.print(f"wrote {OUT} and {OUT.with_suffix('.md').name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
