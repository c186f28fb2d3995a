"""Test doubles for the memory plane: a deterministic bag-of-words embedder and turn/inbox builders."""

from __future__ import annotations

import hashlib

import numpy as np

from core.contracts import Turn
from memory.store import InboxEntry
from memory.text import terms


class WordEmbedder:
    """Each content word hashed to one of `dim` axes, summed, L2-normalised: texts sharing words are close,
    texts sharing none are orthogonal. Counts its calls (what was encoded)."""

    def __init__(self, dim: int = 64):
        self.dim = dim
        self.encoder_id = f"word-hash-{dim}"
        self.calls: list[list[str]] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in terms(text):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else out[i]
        return out


def entry(text: str, *, turn: str = "t0", user: str = "alice", workspace: str = "w", session: str = "s1",
          index: int = 0, cap: str = "user", last: bool = False, at: float = 1.7e9) -> InboxEntry:
    return InboxEntry(turn, session, user, workspace, cap, index, at, last, [text], "ok")


def turn(text: str, *, tenant: str = "alice/w", session: str = "s1", index: int = 0, last: bool = False,
         scope: str = "user", history: list[dict] | None = None, **kw) -> Turn:
    messages = [{"role": "system", "content": "## Memory\n- injected earlier: my editor is nano"},
                *(history or []), {"role": "user", "content": text}]
    return Turn(session_id=session, turn_index=index, tenant=tenant, messages=messages, prompt_ids=[1],
                response_ids=[2], response_logprobs=[-0.5], response_text="sure", last_in_session=last,
                memory_scope=scope, **kw)
