"""Token budgeting of the memory block (pure, given a token counter).

The injected skills and memory share `memory.context_token_budget`; skills are injected first and
memory gets what they left, and never more than the context has room for after the prompt and the
reply. Units go in score order; one that does not fit is skipped and smaller ones after it may still
go. The rendered block is counted whole at the end (a tokenizer's count of a joined text can differ
from the sum of its parts), and shortened until it fits.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from memory.text import estimate_tokens
from memory.units import MemoryUnit

HEADER = ("## Memory\nWhat you remember from earlier conversations with this user (most relevant first; "
          "it may be out of date):")
MESSAGE_OVERHEAD_TOKENS = 8  # chat-template tokens around each message (role markers, separators)


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class EstimatedCounter:
    """No tokenizer (an upstream engine): the conservative estimate of `memory.text.estimate_tokens`."""

    name = "estimate"

    def count(self, text: str) -> int:
        return estimate_tokens(text)


class TokenizerCounter:
    """A model folder's own tokenizer, so counts are exact: its `tokenizer.json`, or with `as_served` the
    tokenizer transformers builds for the folder, which is the one vLLM serves with.

    NOTE: the two can differ. transformers builds some tokenizer classes with their own pre-tokenizer and
    normaliser instead of the file's (`Qwen2Tokenizer`, the tiny model's: its file counts ~22% fewer
    tokens than vLLM renders). `as_served` costs importing transformers (seconds, once per process).
    """

    name = "tokenizer"

    def __init__(self, model_dir: str | Path, *, as_served: bool = False):
        self._tok = _served_tokenizer(model_dir) if as_served else None
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self._tok.no_padding()  # some tokenizer.json files pad or truncate to a fixed length
        self._tok.no_truncation()

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


def _served_tokenizer(model_dir: str | Path):
    """The Rust tokenizer transformers builds for `model_dir` (None: transformers is not installed, or the
    folder's tokenizer has no Rust backend)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    backend = getattr(AutoTokenizer.from_pretrained(str(model_dir)), "backend_tokenizer", None)
    return copy.deepcopy(backend) if backend is not None else None  # padding settings changed: our copy


def make_counter(model_dir: str | None) -> TokenCounter:
    """The served model's exact counter when `model_dir` has a `tokenizer.json`, else the estimate."""
    if model_dir and (Path(model_dir) / "tokenizer.json").is_file():
        return TokenizerCounter(model_dir, as_served=True)
    return EstimatedCounter()


def line(unit: MemoryUnit) -> str:
    day = time.strftime("%Y-%m-%d", time.gmtime(unit.updated_at))
    return f"- ({unit.kind.value.replace('_', ' ')}, {day}) {unit.content}"


def render(units: Sequence[MemoryUnit]) -> str:
    """The block for the system prompt ("" when there is nothing to say)."""
    return "\n".join([HEADER, *map(line, units)]) if units else ""


def memory_budget(total: int, skill_tokens: int, context_room: int) -> int:
    """Tokens left for memory: the shared budget minus the skills' share, capped by the context's room."""
    return max(0, min(total - skill_tokens, context_room))


def fit(units: Sequence[MemoryUnit], budget: int, counter: TokenCounter) -> tuple[list[MemoryUnit], int]:
    """The units (in the given order) whose block fits `budget` tokens, and the block's token count."""
    used = counter.count(HEADER) + 1
    if used >= budget:
        return [], 0
    chosen = []
    for u in units:
        cost = counter.count(line(u)) + 1  # + the newline before it
        if used + cost <= budget:
            chosen.append(u)
            used += cost
    total = counter.count(render(chosen)) if chosen else 0
    while total > budget:
        chosen.pop()
        total = counter.count(render(chosen)) if chosen else 0
    return chosen, total
