"""Pure text helpers of the memory plane: full-text terms, the scope-partitioned index text, token counts."""

from __future__ import annotations

import math
import re
import unicodedata

_WORD = re.compile(r"[^\W_]+")  # letters/digits; "_" splits, as SQLite FTS5's unicode61 tokenizer does
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing don down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just let like ll me
more most my myself no nor not now of off on once only or other our ours ourselves out over own please
re same she should so some such than that the their theirs them themselves then there these they this
those through to too under until up us ve very was we were what when where which while who whom why
will with would you your yours yourself yourselves user users
""".split())
PREFIX_CHARS = 12  # hex chars of a scope key put in front of every indexed term


def fold(text: str) -> str:
    """Lower case without diacritics ("Café" -> "cafe"), as the FTS tokenizer folds them."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def terms(text: str) -> list[str]:
    """Content words of `text`, folded, in order (stopwords and one-character words dropped)."""
    return [w for w in _WORD.findall(fold(text)) if len(w) > 1 and w not in STOPWORDS]


def scope_prefix(scope_key: str) -> str:
    return scope_key[:PREFIX_CHARS]


def index_text(scope_key: str, text: str) -> str:
    """The text the FTS index stores for a unit: each term prefixed by its scope.

    Why: a term then has one posting list per scope, so a search touches only the postings of the
    request's scopes (a shared `scope:x AND ...` filter reads the whole scope's postings: 100k rows).
    Isolation never rests on this prefix: fetched units are checked against their exact scope ids.
    """
    pre = scope_prefix(scope_key)
    return " ".join(pre + t for t in terms(text))


def estimate_tokens(text: str) -> int:
    """A conservative token count without a tokenizer: an ASCII byte is a third of a token, any other
    character two tokens, rounded up.

    Large BPE/WordPiece vocabularies average about 4 bytes of English per token and one or two tokens
    per CJK character; this over-counts both, so a budget met by the estimate is met by the real count
    (checked against MiniLM's 30k WordPiece vocabulary in tests/unit/test_memory_fusion.py).
    """
    ascii_bytes = sum(1 for c in text if ord(c) < 128)
    return math.ceil(ascii_bytes / 3 + 2 * (len(text) - ascii_bytes))


def first_sentence(text: str, max_chars: int = 120) -> str:
    """The first sentence of `text` on one line, cut to `max_chars` with an ellipsis."""
    one = " ".join(text.split())
    m = re.search(r"(?<=[.!?])\s", one)
    head = one[: m.start()] if m else one
    return head if len(head) <= max_chars else head[: max_chars - 1].rstrip() + "…"
