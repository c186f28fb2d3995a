"""Skill retrieval latency at 100 / 1,000 / 10,000 skills, both modes, and the cost of adding a skill.

    python -m benchmarks.retrieval [--sizes 100,1000,10000] [--queries 300] [--encode-limit 1000]
                                   [--backends torch,onnx,int8,static] [--block 20] [--synthetic-vectors]
                                   [--quick]

Skills are generated synthetically (seeded): pseudo-word descriptions mixed with task keywords, ~30%
general. Queries are always encoded with the real all-MiniLM-L6-v2 (offline package) unless
`--synthetic-vectors`; that time is reported separately, per query encoder (`--backends`:
sentence-transformers on torch, the same model on onnxruntime in fp32 (`onnx`) and through its int8 query
graph (`int8`, evolve/int8_encoder.py, the default), and its static model2vec distillation
(evolve/static_encoder.py), all on one thread as in a Proxy replica, taking turns in blocks of `--block`
queries: a replica serves a stream of queries, and a torch forward between two ONNX queries evicts the
caches the next one would find warm, which doubled the ONNX encodes when they alternated per query),
together with the search *including* the (uncached) encode at each size, and each encoder's recall@1/@5
on the labelled skill queries (benchmarks/skill_recall.py), and how each transformer query encoder's
vectors agree with fp32 MiniLM's (cosine; overlap of the top 5 skills on the labelled set). The static
encoder's vectors are in a space of their own, so its searches run against skills encoded by it; torch,
onnx and int8 share one skill matrix (fp32 documents), encoded by the last transformer backend (the
"primary", which also runs the rest). Skills are encoded
with the real model up to `--encode-limit` skills (its throughput is reported, so the one-time cost at
larger sizes can be read off); above it the skill matrix holds seeded random unit vectors of the same
shape, which cost exactly the same to score (a 10,000-skill encode takes minutes on 2 busy cores and
measures the model, not retrieval). The add-one-skill timing uses a SkillBank on a temporary folder holding the largest size,
with name-only and with embedding near-duplicate checks (model time for the new skill excluded, reported
as `encode_one_skill`). The query encode also by query length (8-128 tokens, benchmarks/encode_length.py),
and the search including the encode for the labelled English queries beside the synthetic ones (~14
tokens against ~23 on average). Prints a table, writes benchmarks/out/retrieval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from core.config import SkillsConfig
from core.contracts import Skill
from core.vectors import binary_codes, hamming, nearest
from evolve.bank import SkillBank
from evolve.embedding import EmbeddingCache, SentenceEmbedder, query_vector, skill_text
from evolve.retrieval import (
    PREFILTER_MIN,
    EmbeddingRetriever,
    SkillSearch,
    TemplateRetriever,
    prefilter_candidates,
)
from evolve.skill_md import render_skill_md
from evolve.text import TASK_KEYWORDS

from .encode_length import encode_by_length, token_counts
from .skill_recall import encoder_recall, labelled_set, recall_at_k

OUT = Path(__file__).resolve().parent / "out" / "retrieval.json"
CATEGORIES = ["general", *TASK_KEYWORDS]


class RandomEmbedder:
    """Seeded random unit vectors: the scoring cost of a real model (of the same `dim`) without its encode."""

    def __init__(self, seed: int = 0, dim: int = 384):
        self.rng = np.random.default_rng(seed)
        self.dim, self.encoder_id = dim, f"random-{dim}"

    def encode(self, texts: list[str]) -> np.ndarray:
        v = self.rng.standard_normal((len(texts), self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def vocabulary(rng: np.random.Generator, n: int = 3000) -> list[str]:
    syl = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qua", "bri", "dan", "fel", "gor", "hul"]
    words = {"".join(rng.choice(syl, size=rng.integers(2, 4))) for _ in range(n * 2)}
    return sorted(words)[:n]


def synthetic_skills(n: int, seed: int = 0, prefix: str = "syn") -> list[Skill]:
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    out = []
    for i in range(n):
        cat = CATEGORIES[0] if rng.random() < 0.3 else str(rng.choice(CATEGORIES[1:]))
        kws = list(TASK_KEYWORDS.get(cat, ("always", "check")))
        words = [*rng.choice(vocab, size=10), *rng.choice(kws, size=2)]
        rng.shuffle(words)
        desc = " ".join(words).capitalize() + "."
        body = "# Steps\n" + "\n".join(f"- {' '.join(rng.choice(vocab, size=8))}" for _ in range(4))
        tag = re.sub(r"[^a-z0-9]+", "-", words[0].lower())[:12].strip("-")
        out.append(Skill(name=f"{prefix}-{i:05d}-{tag}".strip("-"), description=desc, category=cat, body=body))
    return out


def synthetic_queries(n: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = vocabulary(np.random.default_rng(0))
    cats = list(TASK_KEYWORDS)
    return [" ".join([*rng.choice(vocab, size=6), *rng.choice(TASK_KEYWORDS[str(rng.choice(cats))], size=2)])
            for _ in range(n)]


def pct(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "n": len(ms)}


def timed(fn, args_list) -> list[float]:
    out = []
    for a in args_list:
        t0 = time.perf_counter()
        fn(*a)
        out.append(time.perf_counter() - t0)
    return out


def bench_size(n: int, queries: list[str], qvecs: np.ndarray, encoders: dict[str, EmbeddingCache],
               primary: str, encode_limit: int, block: int = 20,
               labelled: list[str] | None = None) -> dict[str, Any]:
    """One library size. `labelled`: English queries (the labelled skill queries) also timed through the
    encode + search, beside the synthetic ones (whose pseudo-words make them ~60% more tokens)."""
    skills = synthetic_skills(n)
    caches = skill_caches(encoders, primary, n <= encode_limit)
    cache = caches[primary]
    res: dict[str, Any] = {"skills": n, "skill_vectors": "random" if isinstance(cache.embedder, RandomEmbedder)
                           else "model"}
    tr = TemplateRetriever()
    t0 = time.perf_counter()
    tr.build(skills)
    res["template_build_s"] = time.perf_counter() - t0
    timed(tr.retrieve, [(q, 6, 3) for q in queries[:20]])  # warm-up
    res["template"] = pct(timed(tr.retrieve, [(q, 6, 3) for q in queries]))
    er = EmbeddingRetriever(cache)
    t0 = time.perf_counter()
    er.build(skills)  # encodes every skill once (cached across sizes: same synthetic prefix)
    res["embedding_build_s"] = time.perf_counter() - t0
    res["encoded_per_s"] = n / res["embedding_build_s"] if res["skill_vectors"] == "model" else None
    t0 = time.perf_counter()
    er.build(skills)
    res["embedding_rebuild_cached_s"] = time.perf_counter() - t0
    timed(er.retrieve_vector, [(v, 6, 3) for v in qvecs[:20]])
    res["embedding"] = pct(timed(er.retrieve_vector, [(v, 6, 3) for v in qvecs]))
    retrievers = {}
    for name, c in caches.items():  # one index per vector space: torch and onnx share the primary's
        retrievers[name] = er if c is cache else EmbeddingRetriever(c)
        retrievers[name].build(skills)
    timed_encoders = dict(encoders)
    if n >= PREFILTER_MIN:  # the baseline in the same run: the same query path on the exact scan
        exact = EmbeddingRetriever(cache, prefilter_min=n + 1)
        exact.build(skills)
        retrievers[f"{primary}, exact scan"], timed_encoders[f"{primary}, exact scan"] = exact, encoders[primary]
        timed(exact.retrieve_vector, [(v, 6, 3) for v in qvecs[:20]])
        res["embedding_exact_scan"] = pct(timed(exact.retrieve_vector, [(v, 6, 3) for v in qvecs]))
    res["embedding_with_encode"] = with_encode(retrievers, queries, timed_encoders, block)
    if labelled:
        res["embedding_with_encode_labelled"] = with_encode(retrievers, labelled, timed_encoders, block)
    return res


def skill_caches(encoders: dict[str, EmbeddingCache], primary: str, model_vectors: bool) -> dict[str, EmbeddingCache]:
    """Per condition, the cache its skills are encoded through: the primary's for every encoder of the
    primary's space, its own otherwise; seeded random vectors of the same dim when not `model_vectors`."""
    own: dict[str, EmbeddingCache] = {}  # encoder_id -> cache
    out = {}
    for name in [primary, *[n for n in encoders if n != primary]]:
        emb = encoders[name].embedder
        if emb.encoder_id not in own:
            own[emb.encoder_id] = (encoders[name] if model_vectors
                                   else EmbeddingCache(RandomEmbedder(seed=3, dim=emb.dim)))
        out[name] = own[emb.encoder_id]
    return out


def with_encode(retrievers: dict[str, EmbeddingRetriever], queries: list[str],
                encoders: dict[str, EmbeddingCache], block: int) -> dict[str, Any]:
    """Per query encoder: encode the query (uncached), then retrieve (what a request with a new message
    pays); encoders take turns in blocks of `block` queries."""
    took: dict[str, list[float]] = {name: [] for name in encoders}
    for start in range(0, len(queries), block):
        for name, enc in encoders.items():
            for q in queries[start:start + block]:
                t0 = time.perf_counter()
                retrievers[name].retrieve_vector(query_vector(enc.embedder, q), 6, 3)
                took[name].append(time.perf_counter() - t0)
    return {name: pct(ts) for name, ts in took.items()}


def bench_add(n: int, cache: EmbeddingCache, reps: int = 20) -> dict[str, Any]:
    """Time to add one skill (and to reload / refresh readers) with `n` skills on disk."""
    skills = synthetic_skills(n)
    res: dict[str, Any] = {"skills": n}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for s in skills:  # setup only: plain writes, the bank's own writes are timed below
            (root / s.name).mkdir()
            (root / s.name / "SKILL.md").write_text(render_skill_md(s))
        t0 = time.perf_counter()
        cfg = SkillsConfig(max_skill_bytes=64 * 1024)
        plain = SkillBank(root, cfg)
        res["open_full_scan_s"] = time.perf_counter() - t0
        new = synthetic_skills(2 * reps, seed=7, prefix="new")
        res["add_one_name_dedup"] = pct(timed(plain.add, [(s,) for s in new[:reps]]))
        emb = SkillBank(root, cfg, cache)
        emb.add(new[reps])  # first call builds the (N, D) dedup matrix from the cache
        res["add_one_embedding_dedup"] = pct(timed(emb.add, [(s,) for s in new[reps + 1:]]))
        reader = SkillBank(root, cfg)
        res["reload_unchanged"] = pct(timed(reader.reload, [() for _ in range(200)]))
        plain.add(synthetic_skills(1, seed=9, prefix="late")[0])
        t0 = time.perf_counter()
        reader.reload()
        res["reload_after_one_add_s"] = time.perf_counter() - t0
        for mode in ("template", "embedding"):  # a Proxy's refresh after another process added one skill
            search = SkillSearch(reader, SkillsConfig(retrieval=mode, refresh_s=0.001), cache)
            took = []
            for i in range(5):
                plain.add(synthetic_skills(1, seed=100 + i, prefix=f"{mode[:3]}{i}")[0])
                time.sleep(0.002)
                t0 = time.perf_counter()
                search.refresh()
                took.append(time.perf_counter() - t0)
            res[f"{mode}_refresh_after_one_add"] = pct(took)
    return res


def table(results: dict[str, Any]) -> Table:
    t = Table(title="skill retrieval (ms; query encoding excluded from embedding rows, included in '+ encode')")
    backends = list(results["query_encoding_by_backend"])
    for col in ("skills", "template p50", "template p99", "embedding p50", "embedding p99",
                *[f"+ encode {b} p50" for b in backends], "template build s", "embed build s", "skill vectors",
                "embed rebuild s (cached)"):
        t.add_column(col, justify="right")
    for r in results["sizes"]:
        t.add_row(str(r["skills"]), f"{r['template']['p50_ms']:.3f}", f"{r['template']['p99_ms']:.3f}",
                  f"{r['embedding']['p50_ms']:.3f}", f"{r['embedding']['p99_ms']:.3f}",
                  *[f"{r['embedding_with_encode'][b]['p50_ms']:.2f}" for b in backends],
                  f"{r['template_build_s']:.3f}", f"{r['embedding_build_s']:.2f}", r["skill_vectors"],
                  f"{r['embedding_rebuild_cached_s']:.3f}")
    return t


def query_encoders(backends: list[str], synthetic: bool) -> dict[str, EmbeddingCache]:
    """Conditions by name: torch, onnx (fp32 queries), int8 (the int8 query graph) or static."""
    if synthetic:
        return {"random": EmbeddingCache(RandomEmbedder())}
    import torch

    torch.set_num_threads(1)  # as in a Proxy replica: Ray sets OMP_NUM_THREADS=1
    return {b: EmbeddingCache(make_embedder(b)) for b in backends}


def make_embedder(name: str) -> SentenceEmbedder:
    """A condition's embedder; `int8` must really get the int8 query graph (else the run would mislabel)."""
    if name == "static":
        return SentenceEmbedder(encoder="static")
    if name == "int8":
        emb = SentenceEmbedder(backend="onnx")
        if emb.query_backend != "onnx-int8":
            raise SystemExit("the int8 query encoder is unavailable here (see the log); drop `int8` from --backends")
        return emb
    return SentenceEmbedder(backend=name, query_precision="fp32")


def fp32_agreement(encoders: dict[str, EmbeddingCache], reference: str, queries: list[str]) -> dict[str, Any]:
    """Per transformer condition: cosine of its query vectors to `reference`'s (fp32 ONNX) on `queries`
    and the labelled queries, and the mean overlap of its top 5 labelled skills with the reference's."""
    ref = encoders[reference].embedder
    skills, labelled, _ = labelled_set()
    docs = ref.encode([skill_text(s) for s in skills])
    texts = [*queries, *labelled]
    want = np.stack([query_vector(ref, q) for q in texts])
    top_ref = np.argsort(-(want[len(queries):] @ docs.T), axis=1)[:, :5]
    out = {}
    for name, enc in encoders.items():
        if enc.embedder.encoder_id != ref.encoder_id:
            continue  # another vector space (static): not comparable
        got = np.stack([query_vector(enc.embedder, q) for q in texts])
        cos = (got * want).sum(axis=1)
        top = np.argsort(-(got[len(queries):] @ docs.T), axis=1)[:, :5]
        overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top, top_ref, strict=True)])
        out[name] = {"cos_mean": round(float(cos.mean()), 4), "cos_min": round(float(cos.min()), 4),
                     "top5_overlap_labelled": round(float(overlap), 3)}
    return out


def prefilter_recall(model: EmbeddingCache, n: int, real: int, k: int = 5) -> dict[str, Any]:
    """recall@1/@k on the labelled skill queries when their 48 skills sit in a library of `n` (`real`
    model-encoded synthetic skills, seeded random unit vectors for the rest), searched exactly and through
    the sign-bit prefilter the retriever uses at this size (evolve/retrieval.py), and how often the two
    top-k lists are identical. Queries take the query path (int8 when the model has it)."""
    skills, queries, relevant = labelled_set()
    fill = synthetic_skills(min(real, n - len(skills)))
    docs = model.skill_matrix([*skills, *fill])
    rng = np.random.default_rng(11)
    noise = rng.standard_normal((n - docs.shape[0], docs.shape[1])).astype(np.float32)
    matrix = np.concatenate([docs, noise / np.linalg.norm(noise, axis=1, keepdims=True)])
    codes_t = np.ascontiguousarray(binary_codes(matrix).T)
    names = [s.name for s in skills] + [f"other-{i}" for i in range(n - len(skills))]
    exact, pre = np.zeros((len(queries), n), np.float32), np.full((len(queries), n), -np.inf, np.float32)
    for i, q in enumerate(queries):
        v = query_vector(model.embedder, q)
        exact[i] = matrix @ v
        cand = nearest(hamming(codes_t, binary_codes(v[None])[0]), prefilter_candidates(k))
        pre[i, cand] = exact[i, cand]
    same = np.mean([np.array_equal(a, b) for a, b in zip(np.argsort(-exact, axis=1)[:, :k],
                                                          np.argsort(-pre, axis=1)[:, :k], strict=True)])
    return {"skills": n, "model_encoded": docs.shape[0], "candidates": prefilter_candidates(k),
            "exact": {f"recall_at_{j}": round(recall_at_k(exact, names, relevant, j), 3) for j in (1, k)},
            "prefilter": {f"recall_at_{j}": round(recall_at_k(pre, names, relevant, j), 3) for j in (1, k)},
            f"top{k}_identical": round(float(same), 3)}


def encode_times(encoders: dict[str, EmbeddingCache], queries: list[str], block: int) -> dict[str, dict[str, float]]:
    """p50/p99 of one (uncached) query encode per encoder, the encoders taking turns in blocks of `block`
    queries so all see the same load."""
    took: dict[str, list[float]] = {name: [] for name in encoders}
    for start in range(0, len(queries), block):
        for name, enc in encoders.items():
            for q in queries[start:start + block]:
                t0 = time.perf_counter()
                query_vector(enc.embedder, q)
                took[name].append(time.perf_counter() - t0)
    return {name: pct(ts) for name, ts in took.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--encode-limit", type=int, default=1000, help="largest size encoded by the model")
    ap.add_argument("--backends", default="torch,onnx,int8,static",
                    help="query encoders compared in one run (torch, onnx = fp32 queries, int8, static); the last "
                         "transformer one encodes the skills (fp32) and runs the rest")
    ap.add_argument("--synthetic-vectors", action="store_true", help="random vectors instead of the model")
    ap.add_argument("--block", type=int, default=20, help="queries per turn of an encoder (1: alternate per query)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 100 and 1,000 skills, 100 queries, model-encoded skills only at 100")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.queries, args.encode_limit = "100,1000", 100, 100
    sizes = [int(x) for x in args.sizes.split(",")]
    encoders = query_encoders(args.backends.split(","), args.synthetic_vectors)
    primary = [n for n in encoders if n != "static"][-1] if set(encoders) - {"static"} else "static"
    model = encoders[primary]
    random_cache = EmbeddingCache(RandomEmbedder(seed=3))
    queries = synthetic_queries(args.queries)
    qvecs = model.embedder.encode(queries)  # also warms the model up
    enc = encode_times(encoders, queries[:60], args.block)
    labelled = labelled_set()[1]
    one = synthetic_skills(30, seed=5, prefix="one")
    enc_skill = timed(lambda s: model.skill_matrix([s]), [(s,) for s in one])
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0]},
        "embedder": "random-384" if args.synthetic_vectors else f"all-MiniLM-L6-v2 (cpu, {primary})",
        "query_encoding": enc[primary],
        "query_encoding_by_backend": enc,
        "recall_by_backend": ({} if args.synthetic_vectors
                              else {name: encoder_recall(e.embedder) for name, e in encoders.items()}),
        "encoder_ids": {name: e.embedder.encoder_id for name, e in encoders.items()},
        "fp32_agreement": ({} if args.synthetic_vectors or "onnx" not in encoders
                           else fp32_agreement(encoders, "onnx", queries)),
        "encode_one_skill": pct(enc_skill[5:]),
        "block": args.block,
        "sizes": [bench_size(n, queries, qvecs, encoders, primary, args.encode_limit, args.block,
                             labelled=None if args.synthetic_vectors else labelled) for n in sizes],
    }
    if not args.synthetic_vectors:
        counts = token_counts(queries)
        results["query_tokens"] = {"synthetic_mean": sum(counts) / len(counts),
                                   "labelled_mean": sum(token_counts(labelled)) / len(labelled)}
        results["encode_by_length"] = encode_by_length(encoders, labelled, block=args.block)
    big = max(sizes)
    if not args.synthetic_vectors and big >= PREFILTER_MIN:
        results["prefilter_recall"] = prefilter_recall(model, big, real=args.encode_limit)
    results["add"] = bench_add(big, model if big <= args.encode_limit else random_cache)
    results["machine"]["load_avg_1m_at_end"] = os.getloadavg()[0]
    console = Console(width=130)
    console.print(table(results))
    qe, add = results["query_encoding"], results["add"]
    es = results["encode_one_skill"]
    for name, e in results["query_encoding_by_backend"].items():
        with_enc = max(results["sizes"], key=lambda r: r["skills"])["embedding_with_encode"][name]
        rec = results["recall_by_backend"].get(name, {})
        console.print(f"{name}: query encoding p50 {e['p50_ms']:.2f} ms, p99 {e['p99_ms']:.2f} ms; embedding "
                      f"retrieval at {big:,} including the encode p50 {with_enc['p50_ms']:.2f} ms, "
                      f"p99 {with_enc['p99_ms']:.2f} ms; labelled queries recall@1 {rec.get('recall_at_1')}, "
                      f"recall@5 {rec.get('recall_at_5')}; agreement with fp32 "
                      f"{results['fp32_agreement'].get(name, '-')}")
    console.print(f"query encoding ({primary}): p50 {qe['p50_ms']:.2f} ms, p99 {qe['p99_ms']:.2f} ms; one skill "
                  f"p50 {es['p50_ms']:.2f} ms; skill vectors: "
                  + ", ".join(f"{r['skills']}={r['skill_vectors']}" for r in results["sizes"]))
    console.print(f"add one skill at {add['skills']}: p50 {add['add_one_name_dedup']['p50_ms']:.2f} ms "
                  f"(name dedup), {add['add_one_embedding_dedup']['p50_ms']:.2f} ms (+ embedding dedup); "
                  f"reload unchanged p50 {add['reload_unchanged']['p50_ms']:.3f} ms; reload after one add "
                  f"{add['reload_after_one_add_s'] * 1e3:.2f} ms; open (full scan) {add['open_full_scan_s']:.2f} s; "
                  f"refresh after one add p50: template {add['template_refresh_after_one_add']['p50_ms']:.1f} ms, "
                  f"embedding {add['embedding_refresh_after_one_add']['p50_ms']:.1f} ms (model time excluded)")
    for r in results["sizes"]:
        if "embedding_exact_scan" in r:
            pre, ex = r["embedding_with_encode"][primary], r["embedding_with_encode"][f"{primary}, exact scan"]
            console.print(f"at {r['skills']:,} skills: search p50 {r['embedding']['p50_ms']:.3f} ms prefiltered, "
                          f"{r['embedding_exact_scan']['p50_ms']:.3f} ms exact; including the {primary} encode "
                          f"p50 {pre['p50_ms']:.2f} ms prefiltered, {ex['p50_ms']:.2f} ms exact "
                          f"({pre['p50_ms'] / ex['p50_ms']:.2f}x)")
    if bl := results.get("encode_by_length"):
        qt = results["query_tokens"]
        console.print(f"query tokens: synthetic {qt['synthetic_mean']:.1f}, labelled {qt['labelled_mean']:.1f} on "
                      "average; the encode p50 (ms) by query length in tokens: " + "; ".join(
                          f"{name} " + ", ".join(f"{n}: {v['p50_ms']:.2f}" for n, v in by.items())
                          for name, by in bl["by_encoder"].items()))
    for r in results["sizes"]:
        if lab := r.get("embedding_with_encode_labelled"):
            console.print(f"at {r['skills']:,} skills, the labelled (English) queries including the encode, "
                          "p50: " + ", ".join(f"{name} {v['p50_ms']:.2f} ms" for name, v in lab.items()))
    if pr := results.get("prefilter_recall"):
        console.print(f"sign-bit prefilter at {pr['skills']:,} skills ({pr['model_encoded']} model-encoded, "
                      f"{pr['candidates']} candidates scored): labelled recall@1/@5 exact "
                      f"{pr['exact']['recall_at_1']}/{pr['exact']['recall_at_5']}, prefiltered "
                      f"{pr['prefilter']['recall_at_1']}/{pr['prefilter']['recall_at_5']}; identical top 5 "
                      f"{pr['top5_identical']:.1%}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
