"""Skill and memory retrieval together, as a Proxy replica runs them for one request in embedding mode:
one shared encoder (`evolve.embedding.shared_cache`, what the Proxy builds) against one encoder each (what
it built before 2026-12-04). A benchmark, not a test.

Both read sides are built as the Proxy builds them (`SkillInjector.build`, `MemoryInjector.build`) over the
labelled skill library (benchmarks/data/skill_queries.json, 48 skills) and a memory scope of units written
from the same texts; each request is a new query (the labelled set's 96 requests, then variants), so no
query vector is cached from an earlier request. Per request: skill injection, then memory injection, the
order of `serve/proxy.py _prepare`. Reported: p50/p99 of the pair, and the replica memory each layout
holds (RSS growth from loading its encoders). The layouts take turns in blocks of 20 requests.

Usage: python -m benchmarks.shared_encoder [--requests 200]
Writes benchmarks/out/shared_encoder.json and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "benchmarks" / "out"


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def build(root: Path, shared: bool):
    """(skill injector, memory injector, MB of RSS their encoders added) over a fresh copy of the data."""
    from benchmarks.skill_recall import labelled_set
    from core.config import MemoryConfig, SkillsConfig
    from evolve import embedding
    from evolve.bank import SkillBank
    from memory.store import Plan
    from memory.units import Kind, Level, MemoryUnit
    from serve.injection import SkillInjector
    from serve.memory_injection import MemoryInjector

    skills_cfg, mem_cfg = SkillsConfig(retrieval="embedding"), MemoryConfig(min_similarity=0.0)
    library, _, _ = labelled_set()
    SkillBank(root / "skills", skills_cfg).add_batch(library)
    import onnxruntime  # noqa: F401 - imported before the RSS baseline: a library, not a model
    import tokenizers  # noqa: F401

    embedding._SHARED.clear()  # each layout loads its own models: the RSS it adds is its own
    rss0 = _rss_mb()
    if shared:
        skills = SkillInjector.build(skills_cfg, root / "skills")
        memory = MemoryInjector.build(mem_cfg, root / "memory", tokenizer_path=None, max_model_len=8192)
    else:  # one encoder each, as before: a second SentenceEmbedder for memory
        skills = SkillInjector.build(skills_cfg, root / "skills")
        embedding._SHARED.clear()
        memory = MemoryInjector.build(mem_cfg, root / "memory", tokenizer_path=None, max_model_len=8192)
    added = _rss_mb() - rss0
    units = [MemoryUnit(kind=Kind.semantic, content=f"{s.description} {s.body}", level=Level.user, user="u")
             for s in library]
    vecs = memory.search.embedder.encode([u.content for u in units])
    memory.search.store.apply(Plan(inserts=list(zip(units, vecs, strict=True))), [])
    return skills, memory, added


async def _both(skills, memory, body: dict) -> None:
    mark = memory.mark(body, False)
    await skills.inject(body, anthropic=False)
    await memory.inject(body, False, "u/w", "s", "user", mark)


def one(skills, memory, loop: asyncio.AbstractEventLoop, text: str) -> float:
    body = {"messages": [{"role": "user", "content": text}]}
    t0 = time.perf_counter()
    loop.run_until_complete(_both(skills, memory, body))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from benchmarks.skill_recall import labelled_set

    _, queries, _ = labelled_set()
    texts = [queries[i % len(queries)] + ("" if i < len(queries) else f" (request {i})") for i in range(args.requests)]
    tmp = Path(tempfile.mkdtemp(prefix="clawray-shared-enc-"))
    layouts = {name: build(tmp / name, name == "shared") for name in ("separate", "shared")}
    loop = asyncio.new_event_loop()  # one loop, as a replica has
    for skills, memory, _ in layouts.values():  # warm: first calls build indexes and graphs
        one(skills, memory, loop, "warm up the retrieval path")
    lat: dict[str, list[float]] = {k: [] for k in layouts}
    for start in range(0, len(texts), 20):
        for name, (skills, memory, _) in layouts.items():
            lat[name] += [one(skills, memory, loop, t) for t in texts[start:start + 20]]
    rows = []
    for name, (_, _, added) in layouts.items():
        q = statistics.quantiles(lat[name], n=100, method="inclusive")
        rows.append({"layout": name, "p50_ms": 1000 * q[49], "p99_ms": 1000 * q[98], "encoders_rss_mb": added,
                     "requests": len(lat[name])})
    OUT.mkdir(parents=True, exist_ok=True)
    meta = {"time": time.time(), "cores": os.cpu_count(), "load": os.getloadavg()[0]}
    (OUT / "shared_encoder.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("| layout | skills + memory retrieval p50 / p99 (ms) | RSS the encoders added (MB) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} | {r['encoders_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
