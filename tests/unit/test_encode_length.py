"""benchmarks/encode_length.py: texts cut to exact token counts, and the retrieval report's length table."""

from __future__ import annotations

from benchmarks import report
from benchmarks.encode_length import texts_of_length, token_counts, tokenizer
from benchmarks.skill_recall import labelled_set


def test_texts_are_cut_to_the_asked_token_count_and_all_differ():
    tok, pool = tokenizer(), labelled_set()[1]
    for n in (8, 16, 64, 128):
        texts = texts_of_length(n, 12, pool, tok)
        assert token_counts(texts, tok) == [n] * 12
        assert len(set(texts)) == 12  # each a new query: no encode is served from a cache


def test_the_retrieval_report_shows_the_encode_by_length_and_both_query_sets():
    p = {"p50_ms": 1.0, "p99_ms": 2.0}
    size = {"skills": 10_000, "skill_vectors": "random", "template": p, "embedding": p,
            "embedding_with_encode": {"int8": {"p50_ms": 2.3}}, "embedding_with_encode_labelled": {"int8": {"p50_ms": 1.7}}}
    data = {"sizes": [size], "query_encoding": p, "embedder": "x",
            "query_tokens": {"synthetic_mean": 22.9, "labelled_mean": 14.3},
            "encode_by_length": {"lengths": {"8": {}, "16": {}},
                                 "by_encoder": {"int8": {"8": {"p50_ms": 0.9}, "16": {"p50_ms": 1.2}}}}}
    body, _ = report.retrieval(data)
    assert "| encoder | 8 | 16 |" in body and "| int8 | 0.90 | 1.20 |" in body
    assert "synthetic queries (22.9 tokens on average) / labelled English ones (14.3): int8 2.30 / 1.70" in body
