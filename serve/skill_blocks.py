"""The injected skills block of a stored turn, kept once per distinct text (pure; serve/sessions.py stores).

A turn's `messages` are what the engine saw, skills block included: that block is most of a request's
size (six or nine skills, ~10 KB) and nearly the same on every request, so writing it with every turn cost
more than everything else the store does. The store therefore keeps each distinct block once (its 16-byte
BLAKE2b digest is its key) and a turn's messages without it plus where it was: the message, the content
part (-1: string content) and the character offset. Reading a turn pastes the block back at that place,
so every reader (scorer, evolver, gate, trainer, CLI) gets the messages byte for byte as served; the
prompt ids, which training uses, are stored as they were captured. Nothing is re-rendered from the skill
library (its texts may have changed since the turn, or been edited by hand).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

ROLES = ("system", "developer")  # where the Proxy injects (serve/injection.py add_to_system)


@lru_cache(maxsize=64)  # a few distinct blocks are injected over and over: hashing ~10 KB per turn cost ~10 us
def block_ref(block: str) -> str:
    return hashlib.blake2b(block.encode(), digest_size=16).hexdigest()


def cut(messages: list[dict[str, Any]], block: str) -> tuple[list[dict[str, Any]], list[int]] | None:
    """`messages` without the first occurrence of `block` in a system/developer message (copies of the
    changed message and part only), and where it was: [message, part (-1: string content), offset].
    None when it is not there (the messages are then stored whole)."""
    if not block:
        return None
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            continue
        content = m.get("content")
        if isinstance(content, str):
            if (off := content.find(block)) >= 0:
                return _replace(messages, i, {**m, "content": content[:off] + content[off + len(block):]}), [i, -1, off]
        elif isinstance(content, list):
            for j, p in enumerate(content):
                text = p.get("text") if isinstance(p, dict) else None
                if isinstance(text, str) and (off := text.find(block)) >= 0:
                    parts = _replace(content, j, {**p, "text": text[:off] + text[off + len(block):]})
                    return _replace(messages, i, {**m, "content": parts}), [i, j, off]
    return None


def paste(messages: list[dict[str, Any]], at: list[int], block: str) -> list[dict[str, Any]]:
    """The inverse of `cut`: `block` back at `at` = [message, part, offset]."""
    i, j, off = at
    m = messages[i]
    if j < 0:
        content = m["content"]
        return _replace(messages, i, {**m, "content": content[:off] + block + content[off:]})
    p = m["content"][j]
    parts = _replace(m["content"], j, {**p, "text": p["text"][:off] + block + p["text"][off:]})
    return _replace(messages, i, {**m, "content": parts})


def _replace(items: list, i: int, item: Any) -> list:
    out = list(items)
    out[i] = item
    return out
