"""The query encode by query length (benchmarks/retrieval.py): what a request's retrieval costs depends on
how many tokens its query has, and the retrieval benchmark's synthetic queries (pseudo-words: 23-28
tokens for 8 words) are longer than English queries of the same word count (the labelled skill queries
average ~14 tokens). Texts here are cut from the labelled queries (real English words) to exact token
counts of the model's tokenizer, special tokens included, each text new (no query vector is reused).
"""

from __future__ import annotations

from typing import Any

from evolve.embedding import DEFAULT_MODEL, EmbeddingCache, resolve_model_path

LENGTHS = (8, 16, 32, 64, 128)


def tokenizer():
    """all-MiniLM-L6-v2's tokenizer without padding or truncation (counts tokens as the encoder sees them)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(resolve_model_path(DEFAULT_MODEL) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def token_counts(texts: list[str], tok=None) -> list[int]:
    """Tokens per text, [CLS] and [SEP] included."""
    tok = tok or tokenizer()
    return [len(e.ids) for e in tok.encode_batch(texts)]


def texts_of_length(n_tokens: int, count: int, pool: list[str], tok=None) -> list[str]:
    """`count` different texts of `n_tokens` tokens each (specials included), from consecutive words of
    `pool` joined end to end, starting at a different word each; cut at a token boundary."""
    tok = tok or tokenizer()
    words = " ".join(pool).split()
    out: list[str] = []
    for i in range(count):
        start = (i * 7919) % len(words)  # a prime stride: starts spread over the pool
        span = " ".join(words[start:start + 4 * n_tokens] + words[:max(0, start + 4 * n_tokens - len(words))])
        enc = tok.encode(span, add_special_tokens=False)
        body = n_tokens - 2
        end = enc.offsets[body - 1][1] if len(enc.ids) >= body else len(span)
        out.append(span[:end])
    return out


def encode_by_length(encoders: dict[str, EmbeddingCache], pool: list[str], lengths=LENGTHS, count: int = 40,
                     block: int = 20) -> dict[str, Any]:
    """Per encoder and length: p50/p99 of one uncached query encode; encoders take turns in blocks of
    `block` texts. Also the texts' measured token counts (the cut is exact up to a word piece)."""
    from .retrieval import encode_times  # the retrieval benchmark's blocked timing of uncached encodes

    tok = tokenizer()
    out: dict[str, Any] = {"lengths": {}, "by_encoder": {name: {} for name in encoders}}
    for n in lengths:
        texts = texts_of_length(n, count, pool, tok)
        counts = token_counts(texts, tok)
        out["lengths"][str(n)] = {"mean_tokens": sum(counts) / len(counts), "min": min(counts), "max": max(counts)}
        for name, p in encode_times(encoders, texts, block).items():
            out["by_encoder"][name][str(n)] = p
    return out
