"""Memory retrieval latency at 100k units per scope, and ingestion throughput.

    nice -n 10 python -m benchmarks.memory_retrieval [--units 100000] [--others 2x10000] [--queries 300]
                                                     [--ingest-turns 200] [--backends torch,onnx,int8,static]
                                                     [--block 20]
                                                     [--quick]

A SQLite memory store is filled with `--units` synthetic units in ONE workspace scope (the measured one)
plus other users' scopes (`--others`), all encoded with the real all-MiniLM-L6-v2; a second store holds
the same units encoded with its static distillation (evolve/static_encoder.py: a vector space of its
own) when `static` is a condition. Encoding 120k texts takes minutes on 2 cores, so the encoded corpora
are cached under .cache/memory_bench/ (gitignored) and reruns only rebuild the stores. Then:

- retrieval: `MemorySearch.search` per query, end to end as the Proxy calls it (the vector leg, query
  encode then binary-prefiltered vector search, on a helper thread overlapped with the FTS5 search; one
  fetch of the candidates' rows with the scope check; fusion; units built for the top_k), p50/p99; and
  each stage alone (encode, FTS, vectors, fetch+fuse) p50/p99; per query encoder (`--backends`:
  sentence-transformers on torch, the same model on onnxruntime in fp32 (`onnx`) and through its int8
  query graph (`int8`, evolve/int8_encoder.py, the default; its queries search the same fp32 unit
  vectors), and `static`, taking turns query by query so all see the same load; the last transformer one
  encodes the units and runs everything else; and that one again with the legs one after the other,
  MemorySearch(overlap=False), instead of the vector leg on a helper thread beside the full-text leg);
  conditions take turns in blocks of `--block` queries (a replica serves a stream of queries: a torch
  forward between two queries evicts the caches the next one would find warm, which doubled the ONNX
  encodes when they alternated query by query); cold start (the first
  search loads the scope's vectors); hit@6 of the unit each query was written for (quality), for hybrid,
  full text only and vectors only; recall@10 of the prefilter against exact vector search.
- paraphrases: 20 real facts planted among the synthetic units, asked with questions that share few or
  no words with them ("which city am I based in?" for "The user lives in Toronto."): hit@6 end to end
  and per leg, per query encoder.
- repeated query: an agent's tool-call steps resend the same user message (the query vector is cached).
- ingestion: conversations of `--ingest-turns` turns through the offline extractor, the encoder and
  consolidation into the 100k scope; turns/s and units/s, per vector space.
- forgetting one of the other users (its units, FTS rows, vectors; the FTS index rewritten): seconds.

Torch and onnxruntime run on one thread, as in the Ray workers that encode in production (Ray sets
OMP_NUM_THREADS=1). The load average at start and end is recorded: the numbers move with it.
Prints a table, writes benchmarks/out/memory_retrieval.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from core.config import MemoryConfig
from evolve.embedding import SentenceEmbedder, query_vector
from memory.extract import OfflineExtractor
from memory.fusion import fuse
from memory.index import ScopeVectors, adopt_encoder, binary_codes
from memory.ingest import Ingestor
from memory.retrieval import MemorySearch
from memory.rows import unit_of, unit_row
from memory.sqlite_store import SqliteMemoryStore
from memory.store import InboxEntry, Plan, ScopeChanges
from memory.units import Kind, Level, MemoryUnit, Scope, request_scopes

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out" / "memory_retrieval.json"
CACHE = ROOT / ".cache" / "memory_bench"
ATTRS = ["editor", "shell", "timezone", "deploy target", "database", "test runner", "ci provider", "region",
         "linter", "formatter", "package manager", "issue tracker", "release branch", "api version",
         "monitoring tool", "message queue", "cache", "container runtime", "build tool", "code owner"]
THINGS = ["migration", "release", "refactor", "rollout", "benchmark", "audit", "redesign", "cleanup"]
STATES = ["blocked", "done", "in progress", "on hold", "deployed", "failing", "ready for review"]


PARAPHRASES = [
    ("The user's timezone is Europe/Paris.", "what time zone am I in?"),
    ("The user prefers tabs over spaces.", "how should I indent my code?"),
    ("The billing migration is blocked on the database team.", "why is the payments database work stuck?"),
    ("The user's editor is vim.", "which text editor do I use?"),
    ("The deploy target is eu-west-1.", "which AWS region do we ship to?"),
    ("The user works at Acme Corp.", "where is my job?"),
    ("The user has a cat named Miso.", "what's my pet called?"),
    ("The user's favourite programming language is Rust.", "which language do I like most?"),
    ("The release is scheduled for Friday.", "when do we launch?"),
    ("The user is allergic to peanuts.", "is there any food I can't eat?"),
    ("The user wants answers in French.", "what language should replies be in?"),
    ("The test suite takes 20 minutes to run.", "how long do tests take?"),
    ("The API rate limit is 100 requests per minute.", "how many calls per minute can we make to the service?"),
    ("The user's manager is Dana.", "who is my boss?"),
    ("The staging server is down for maintenance.", "is the preprod box available?"),
    ("The user lives in Toronto.", "which city am I based in?"),
    ("The user dislikes long explanations.", "how verbose should you be?"),
    ("The frontend is written in React.", "what UI framework do we use?"),
    ("The user's birthday is in March.", "when do I celebrate getting older?"),
    ("The CI runs on GitHub Actions.", "where does continuous integration run?"),
]


def vocabulary(rng: np.random.Generator, n: int = 6000) -> list[str]:
    syl = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qua", "bri", "dan", "fel", "gor", "hul",
           "pex", "tor", "ul", "yan", "wic"]
    words = {"".join(rng.choice(syl, size=rng.integers(2, 4))) for _ in range(n * 3)}
    return sorted(words)[:n]


def corpus(n: int, seed: int) -> tuple[list[tuple[str, str]], list[str]]:
    """`n` (kind, content) units and, per unit, a query written for it (a question, not its text)."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    units, queries = [], []
    for i in range(n):
        proj, a, b = (str(w) for w in rng.choice(vocab, 3))
        form = i % 4
        if form == 0:
            attr = ATTRS[int(rng.integers(len(ATTRS)))]
            units.append(("semantic", f"The user's {attr} for the {proj} project is {a}."))
            queries.append(f"which {attr} do we use on {proj}?")
        elif form == 1:
            units.append(("preference", f"The user prefers {a} over {b} when working on {proj}."))
            queries.append(f"should I pick {a} or {b} for {proj}?")
        elif form == 2:
            thing, state = THINGS[int(rng.integers(len(THINGS)))], STATES[int(rng.integers(len(STATES)))]
            units.append(("project_state", f"The {proj} {thing} is {state}; {a} is the next step."))
            queries.append(f"how is the {thing} of {proj} going?")
        else:
            units.append(("episodic", f"On 2026-{1 + i % 12:02d}-{1 + i % 28:02d} the user asked about {a} "
                                      f"in {proj} and about {b}."))
            queries.append(f"what did I ask about {a} in {proj}?")
    return units, queries


def encoded(texts: list[str], embedder: SentenceEmbedder, name: str) -> np.ndarray:
    """(N, dim) vectors of `texts`, from the cache when this exact corpus was encoded by this encoder before."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tag = "" if embedder.encoder_id == "all-MiniLM-L6-v2" else "-" + embedder.encoder_id.replace("+", "-")
    path = CACHE / f"{name}{tag}.npy"
    if path.is_file():
        vecs = np.load(path)
        if vecs.shape[0] == len(texts):
            return vecs
    t0 = time.perf_counter()
    vecs = embedder.encode(texts)
    print(f"encoded {len(texts)} texts in {time.perf_counter() - t0:.0f} s (cached at {path})", flush=True)
    np.save(path, vecs)
    return vecs


def fill(store: SqliteMemoryStore, units: list[tuple[str, str]], vecs: np.ndarray, user: str, ws: str,
         now: float) -> tuple[list[str], float]:
    """Write the units in transactions of 5000; returns their ids and units/s."""
    ids, t0 = [], time.perf_counter()
    for i in range(0, len(units), 5000):
        plan = Plan()
        for j in range(i, min(i + 5000, len(units))):
            kind, content = units[j]
            u = MemoryUnit(kind=Kind(kind), content=content, level=Level.workspace, user=user, workspace=ws,
                           created_at=now - j, updated_at=now - j, confidence=0.8)
            plan.inserts.append((u, vecs[j]))
            ids.append(u.unit_id)
        store.apply(plan, [])
    return ids, len(units) / (time.perf_counter() - t0)


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}


STAGES = ("search", "encode", "full_text", "vectors", "fetch")


def measure(searches: dict[str, MemorySearch], queries: list[str], targets: dict[str, list[str]], user: str,
            ws: str, block: int = 20) -> dict[str, dict[str, Any]]:
    """Per condition (query encoder): end-to-end search and each stage on its own, plus hit@top_k of the
    target unit (`targets`: per condition, its store's ids). The conditions take turns in blocks of
    `block` queries, so a change in the machine's load hits all alike."""
    scopes = request_scopes(user, ws, "bench-session")
    cold = {}
    for name, search in searches.items():
        t0 = time.perf_counter()
        search.search(queries[0], scopes)
        cold[name] = time.perf_counter() - t0
    times = {name: {stage: [] for stage in STAGES} for name in searches}
    hits = {name: {"hybrid": 0, "full_text": 0, "vectors": 0} for name in searches}
    for start in range(0, len(queries), block):
        for name, search in searches.items():
            for i in range(start, min(start + block, len(queries))):
                one_query(search, queries[i], targets[name][i], scopes, times[name], hits[name])
    n = len(queries)
    return {name: {"cold_first_search_s": round(cold[name], 2), **{st: pct(times[name][st]) for st in STAGES},
                   "hit_at_k": {k: round(v / n, 3) for k, v in hits[name].items()}} for name in searches}


def one_query(search: MemorySearch, q: str, target: str, scopes: list[Scope], times: dict[str, list[float]],
              hits: dict[str, int]) -> None:
    store, emb, index, cfg = search.store, search.embedder, search.index, search.cfg
    keys = [s.key for s in scopes]
    t = time.perf_counter()
    res = search.search(q, scopes)
    times["search"].append(time.perf_counter() - t)
    hits["hybrid"] += target in {u.unit_id for u, _ in res.hits}
    t = time.perf_counter()
    qv = query_vector(emb, q)  # the query path: the int8 graph where the embedder has one
    times["encode"].append(time.perf_counter() - t)
    t = time.perf_counter()
    text_ids = store.full_text(keys, q, cfg.candidates, cfg.fts_max_df)
    times["full_text"].append(time.perf_counter() - t)
    t = time.perf_counter()
    vec_ids = [u for u, c in index.search(keys, qv, cfg.candidates) if c >= cfg.min_similarity]
    times["vectors"].append(time.perf_counter() - t)
    t = time.perf_counter()  # as MemorySearch.search: one fetch of the rows, fusion, units for the top_k
    rows = store.fetch_rows(list(dict.fromkeys([*text_ids, *vec_ids])), scopes)
    fused = fuse([text_ids, vec_ids], {r[0]: unit_row(r) for r in rows}, time.time(), search.weights)
    [unit_of(r.row) for r, _ in fused[: cfg.top_k]]
    times["fetch"].append(time.perf_counter() - t)
    hits["full_text"] += target in text_ids[: cfg.top_k]
    hits["vectors"] += target in vec_ids[: cfg.top_k]


def paraphrases(store: SqliteMemoryStore, searches: dict[str, MemorySearch], user: str,
                ws: str) -> dict[str, dict[str, Any]]:
    """Plant PARAPHRASES' facts in the scope (encoded as documents by the first of `searches`, which all
    share the store's vector space); per query encoder, hit@top_k of each question, end to end and per leg."""
    facts = [f for f, _ in PARAPHRASES]
    first = next(iter(searches.values()))
    ids, _ = fill(store, [("semantic", f) for f in facts], first.embedder.encode(facts), user, ws, time.time())
    scopes = request_scopes(user, ws, "bench-session")
    keys, cfg, n = [s.key for s in scopes], first.cfg, len(PARAPHRASES)
    out = {}
    for name, search in searches.items():
        hybrid = full_text = vectors = 0
        for uid, (_, question) in zip(ids, PARAPHRASES, strict=True):
            hybrid += uid in {u.unit_id for u, _ in search.search(question, scopes).hits}
            full_text += uid in store.full_text(keys, question, cfg.candidates, cfg.fts_max_df)[: cfg.top_k]
            q = query_vector(search.embedder, question)
            vectors += uid in [u for u, c in search.index.search(keys, q, cfg.top_k) if c >= cfg.min_similarity]
        out[name] = {"hybrid": hybrid / n, "full_text": full_text / n, "vectors": vectors / n}
    return out


def repeated(search: MemorySearch, query: str, user: str, ws: str, n: int = 50) -> dict[str, float]:
    scopes = request_scopes(user, ws, "bench-session")
    search.search(query, scopes)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        search.search(query, scopes)
        times.append(time.perf_counter() - t)
    return pct(times)


def prefilter_recall(vecs: np.ndarray, queries: np.ndarray, k: int = 10) -> float:
    sv = ScopeVectors(vecs.shape[1])
    sv.apply(ScopeChanges([(str(i), "semantic", v.astype("<f4").tobytes(), True) for i, v in enumerate(vecs)],
                          [], 1, True))
    got = []
    for q in queries:
        code = binary_codes(q[None])[0]
        exact = {h[0] for h in sv.search(q, code, k, None, 10**9, 10, 256)}
        approx = {h[0] for h in sv.search(q, code, k, None, 0, 10, 256)}
        got.append(len(exact & approx) / k)
    return round(float(np.mean(got)), 3)


def ingestion(store: SqliteMemoryStore, embedder: SentenceEmbedder, turns: int, ws: str) -> dict[str, Any]:
    """Conversations of 4 turns each, every turn stating a few facts, ingested into the big scope's user."""
    rng = np.random.default_rng(7)
    vocab = vocabulary(rng)
    ing = Ingestor(store, MemoryConfig(), OfflineExtractor(), embedder)
    t0, units = time.perf_counter(), 0
    for c in range(max(1, turns // 4)):
        session = f"ingest-{c}"
        for i in range(4):
            a, b, p = (str(w) for w in rng.choice(vocab, 3))
            text = (f"My {ATTRS[(c + i) % len(ATTRS)]} is {a}. I prefer {b} for reviews. "
                    f"The {p} migration is blocked. Can you help me with the {a} config?")
            store.inbox_add(InboxEntry(f"{session}-{i}", session, "bench", ws, "user", i, time.time(), i == 3,
                                       [text], "Sure."))
        report = asyncio.run(ing.ingest(("bench", ws, session)))
        units += report.inserted + report.merged
    dt = time.perf_counter() - t0
    n = max(1, turns // 4) * 4
    return {"turns": n, "turns_per_s": round(n / dt, 1), "units_per_s": round(units / dt, 1)}


def make_embedders(backends: list[str]) -> tuple[dict[str, SentenceEmbedder], str]:
    """Conditions by name (SentenceEmbedder backends, or `static`) and the primary: the last transformer."""
    import torch

    torch.set_num_threads(1)  # as in a Proxy replica or the Memory actor: Ray sets OMP_NUM_THREADS=1
    from benchmarks.retrieval import make_embedder  # one definition of the conditions for both benchmarks

    embedders = {b: make_embedder(b) for b in backends}
    transformers = [b for b in embedders if b != "static"]
    return embedders, transformers[-1] if transformers else backends[-1]


def build_store(path: Path, embedder: SentenceEmbedder, units: list[tuple[str, str]], n_others: int,
                per_other: int, now: float) -> tuple[SqliteMemoryStore, list[str], float, np.ndarray]:
    """A store of the measured scope and the other users' scopes, vectors by `embedder`: (store, the
    measured scope's ids, its write rate, its vectors)."""
    store = SqliteMemoryStore(path)
    adopt_encoder(store, embedder.encoder_id, embedder.encode)  # empty: records the encoder (unless legacy)
    vecs = encoded([c for _, c in units], embedder, f"main-{len(units)}-s0")
    ids, write_rate = fill(store, units, vecs, "bench", "ws", now)
    for o in range(n_others):
        other, _ = corpus(per_other, seed=100 + o)
        fill(store, other, encoded([c for _, c in other], embedder, f"other-{per_other}-s{100 + o}"),
             f"other-{o}", "ws", now)
    return store, ids, write_rate, vecs


def space_quality(store: SqliteMemoryStore, searches: dict[str, MemorySearch], vecs: np.ndarray,
                  queries: list[str], ingest_turns: int) -> dict[str, Any]:
    """Per vector space (`searches`: its query encoders, the one that encodes its documents first):
    prefilter recall and paraphrase hits per query encoder, ingestion throughput."""
    embedder = next(iter(searches.values())).embedder
    return {"prefilter_recall_at_10": {name: prefilter_recall(vecs, np.stack([query_vector(s.embedder, q)
                                                                             for q in queries[:100]]))
                                       for name, s in searches.items()},
            "paraphrase_hit_at_k": paraphrases(store, searches, "bench", "ws"),
            "ingestion": ingestion(store, embedder, ingest_turns, "ws")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--others", default="2x10000", help="other users' scopes: COUNTxUNITS")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--ingest-turns", type=int, default=200)
    ap.add_argument("--backends", default="torch,onnx,int8,static",
                    help="query encoders compared in one run (torch, onnx = fp32 queries, int8, static); the "
                         "last transformer one encodes the units (fp32) and runs the rest")
    ap.add_argument("--block", type=int, default=20, help="queries per turn of a condition (1: alternate per query)")
    ap.add_argument("--quick", action="store_true", help="10k units, 100 queries, 40 ingested turns")
    args = ap.parse_args(argv)
    if args.quick:
        args.units, args.others, args.queries, args.ingest_turns = 10_000, "1x2000", 100, 40
    n_others, per_other = (int(x) for x in args.others.split("x"))
    load_at_start = round(os.getloadavg()[0], 2)
    embedders, primary = make_embedders(args.backends.split(","))
    units, queries = corpus(args.units, seed=0)
    pick = np.random.default_rng(3).choice(args.units, size=args.queries, replace=False)
    asked, now, cfg = [queries[i] for i in pick], time.time(), MemoryConfig()
    CACHE.mkdir(parents=True, exist_ok=True)  # the stores are built beside the cached corpora
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        spaces: dict[str, tuple[SqliteMemoryStore, list[str], float, np.ndarray]] = {}
        for name in [primary, *[n for n in embedders if n != primary]]:  # one store per vector space
            eid = embedders[name].encoder_id
            if eid not in spaces:
                spaces[eid] = build_store(Path(tmp) / f"memory-{len(spaces)}.db", embedders[name], units,
                                          n_others, per_other, now)
        searches = {b: MemorySearch(spaces[e.encoder_id][0], cfg, e) for b, e in embedders.items()}
        # The default overlaps the vector leg (on a helper thread) with the full-text leg; the primary
        # encoder with the legs one after the other (`overlap=False`) is measured in the same turns.
        sequential = f"{primary} sequential"
        searches[sequential] = MemorySearch(spaces[embedders[primary].encoder_id][0], cfg, embedders[primary],
                                            overlap=False)
        emb_of = {**embedders, sequential: embedders[primary]}
        conditions = measure(searches, asked, {b: [spaces[e.encoder_id][1][i] for i in pick]
                                               for b, e in emb_of.items()}, "bench", "ws", args.block)
        store, _, write_rate, _ = spaces[embedders[primary].encoder_id]
        result = {**conditions[primary], "encoder": primary, "conditions": conditions,
                  "repeated_query": repeated(searches[primary], asked[0], "bench", "ws")}
        by_space = {}
        for b in [primary, *[n for n in embedders if n != primary]]:  # the primary encodes its space's units
            eid = embedders[b].encoder_id
            if eid not in by_space:
                sp_store, _, _, sp_vecs = spaces[eid]
                names = [b, *[n for n, x in embedders.items() if x.encoder_id == eid and n != b]]
                by_space[eid] = {"conditions": names, **space_quality(
                    sp_store, {n: searches[n] for n in names}, sp_vecs, asked, args.ingest_turns)}
        result["spaces"] = by_space
        result.update({k: by_space[embedders[primary].encoder_id][k]
                       for k in ("prefilter_recall_at_10", "paraphrase_hit_at_k", "ingestion")})
        if n_others:  # forgetting a user: delete + FTS optimize + WAL truncate, on the whole store
            t = time.perf_counter()
            result["forget_user_units"] = store.forget("other-0")
            result["forget_user_s"] = round(time.perf_counter() - t, 2)
        for s in searches.values():
            s.close()
        db_mb = sum(p.stat().st_size for p in Path(tmp).iterdir() if p.name.startswith("memory-0")) / 2**20
    result.update({"units_in_scope": args.units, "other_scopes": f"{n_others}x{per_other}",
                   "store_write_units_per_s": round(write_rate, 1), "db_mb": round(db_mb, 1),
                   "queries": args.queries, "block": args.block, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                   "load_avg_at_start": load_at_start, "load_avg_at_end": round(os.getloadavg()[0], 2)})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    report(result, primary, args.units, args.others, cfg.top_k)
    return 0


def report(result: dict[str, Any], primary: str, units: int, others: str, top_k: int) -> None:
    conditions = result["conditions"]
    table = Table(title=f"memory retrieval at {units:,} units in the scope (+ {others} other), "
                        f"{result['queries']} queries, load avg {result['load_avg_at_start']} -> "
                        f"{result['load_avg_at_end']}")
    table.add_column("stage")
    for name in conditions:
        table.add_column(f"{name} p50 ms")
        table.add_column(f"{name} p99 ms")
    for stage in STAGES:
        table.add_row(stage, *[f"{conditions[n][stage][k]:.2f}" for n in conditions for k in ("p50_ms", "p99_ms")])
    rq = result["repeated_query"]  # measured with the primary encoder only (its vector is cached)
    table.add_row("repeated_query (vector cached)",
                  *[f"{rq[k]:.2f}" if n == primary else "" for n in conditions for k in ("p50_ms", "p99_ms")])
    console = Console(width=140)
    console.print(table)
    for name, c in conditions.items():
        console.print(f"{name}: hit@{top_k} {c['hit_at_k']}; cold first search {c['cold_first_search_s']} s")
    for eid, sp in result["spaces"].items():
        console.print(f"{eid} ({', '.join(sp['conditions'])}): paraphrases {sp['paraphrase_hit_at_k']}; "
                      f"prefilter recall@10 {sp['prefilter_recall_at_10']}; ingestion {sp['ingestion']}")
    console.print(f"store writes {result['store_write_units_per_s']} units/s; db {result['db_mb']} MB; "
                  f"forget a user of {result.get('forget_user_units')} units: {result.get('forget_user_s')} s")

if __name__ == "__main__":
    raise SystemExit(main())
