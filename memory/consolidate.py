"""Consolidation (pure): decide, per extracted unit, whether it is new, a near duplicate of a unit the scope
already holds (merge: refresh it), or a new value for a slot the scope already fills (supersede: the
old unit is kept as history and never retrieved again).

Rules, for a fresh unit u in scope S with vector v:
1. u has a slot key and S holds an active unit e of the same kind and key: the same text -> merge into
   e; any other text supersedes e (a contradiction: "my editor is vim" then "my editor is emacs").
   No cosine here: those two sentences are near neighbours for a sentence embedder, yet they disagree.
2. otherwise, the nearest active unit e of S of the same kind: same text or cosine >= dup_threshold
   -> merge into e; otherwise insert u.
Units earlier in the same batch count as held by S, so a batch never writes two near duplicates.
Lookups into the store are handed in as functions, so this module needs no store and no Ray.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from memory.store import Merge, Plan
from memory.text import fold
from memory.units import Kind, MemoryUnit, Scope

# (scope, kind, key) -> the active unit filling that slot, or None
SlotLookup = Callable[[Scope, Kind, str], MemoryUnit | None]
# (scope, kind, vector or None, content) -> (nearest active unit, cosine) or (None, -1); without a vector,
# a unit with the same normalised text (cosine 1) or nothing
NearestLookup = Callable[[Scope, Kind, np.ndarray | None, str], tuple[MemoryUnit | None, float]]


def same_text(a: str, b: str) -> bool:
    """Equal up to case, diacritics, spacing and punctuation."""
    def norm(s: str) -> str:
        return " ".join(re.sub(r"[^\w\s]", " ", fold(s)).split())
    return norm(a) == norm(b)


def _cos(a: np.ndarray | None, b: np.ndarray | None) -> float:
    return float(np.dot(a, b)) if a is not None and b is not None else -1.0


class _Batch:
    """The plan being built, plus the batch's own units as lookups for the units after them."""

    def __init__(self) -> None:
        self.plan = Plan()
        self.pos: dict[str, int] = {}  # unit id -> index in plan.inserts

    def slot(self, scope: Scope, kind: Kind, key: str) -> MemoryUnit | None:
        for unit, _ in reversed(self.plan.inserts):
            if unit.active and unit.scope == scope and unit.kind == kind and unit.key == key:
                return unit
        return None

    def nearest(self, scope: Scope, kind: Kind, vec: np.ndarray | None, content: str) -> tuple[MemoryUnit | None, float]:
        best: tuple[MemoryUnit | None, float] = (None, -1.0)
        for unit, v in self.plan.inserts:
            if unit.active and unit.scope == scope and unit.kind == kind:
                sim = 1.0 if same_text(unit.content, content) else _cos(vec, v)
                if sim > best[1]:
                    best = (unit, sim)
        return best

    def insert(self, unit: MemoryUnit, vec: np.ndarray | None) -> None:
        self.pos[unit.unit_id] = len(self.plan.inserts)
        self.plan.inserts.append((unit, vec))

    def merge(self, into: MemoryUnit, fresh: MemoryUnit) -> None:
        if into.unit_id in self.pos:  # still unwritten: update the pending insert itself
            i = self.pos[into.unit_id]
            unit, vec = self.plan.inserts[i]
            turns = list(dict.fromkeys([*unit.source_turns, *fresh.source_turns]))
            self.plan.inserts[i] = (unit.model_copy(update={
                "mentions": unit.mentions + 1, "confidence": max(unit.confidence, fresh.confidence),
                "updated_at": fresh.updated_at, "source_turns": turns}), vec)
        else:
            self.plan.merges.append(Merge(into.unit_id, fresh.updated_at, fresh.confidence, fresh.source_turns))

    def supersede(self, old: MemoryUnit, fresh: MemoryUnit, vec: np.ndarray | None) -> None:
        new = fresh.model_copy(update={"supersedes": old.unit_id})
        if old.unit_id in self.pos:
            i = self.pos[old.unit_id]
            unit, v = self.plan.inserts[i]
            self.plan.inserts[i] = (unit.model_copy(update={"superseded_by": new.unit_id}), v)
        else:
            self.plan.supersessions.append((old.unit_id, new.unit_id))
        self.insert(new, vec)


def consolidate(items: Sequence[tuple[MemoryUnit, np.ndarray | None]], slot: SlotLookup, nearest: NearestLookup,
                dup_threshold: float) -> Plan:
    """The plan for fresh units `items` (each with its unit vector or None), in order."""
    batch = _Batch()
    for unit, vec in items:
        if unit.key:
            held = batch.slot(unit.scope, unit.kind, unit.key)
            if held is None:
                held = slot(unit.scope, unit.kind, unit.key)
            if held is not None:
                if same_text(held.content, unit.content):
                    batch.merge(held, unit)
                else:
                    batch.supersede(held, unit, vec)
                continue
        near, sim = batch.nearest(unit.scope, unit.kind, vec, unit.content)
        stored, stored_sim = nearest(unit.scope, unit.kind, vec, unit.content)
        if stored is not None and stored_sim > sim:
            near, sim = stored, stored_sim
        if near is not None and sim >= dup_threshold:
            batch.merge(near, unit)
        else:
            batch.insert(unit, vec)
    return batch.plan
