"""Consolidation: near duplicates merge, a new value for a slot supersedes the old one (history kept)."""

from __future__ import annotations

import numpy as np

from memory.consolidate import consolidate, same_text
from memory.units import Kind, Level, MemoryUnit
from tests.memory_fakes import WordEmbedder

EMB = WordEmbedder()


def unit(content: str, kind: Kind = Kind.semantic, key: str | None = None, user: str = "alice") -> MemoryUnit:
    return MemoryUnit(kind=kind, content=content, key=key, level=Level.user, user=user, source_turns=["t"])


def vec(text: str) -> np.ndarray:
    return EMB.encode([text])[0]


class Held:
    """What the store holds, for the lookups."""

    def __init__(self, *units: MemoryUnit):
        self.units = list(units)

    def slot(self, scope, kind, key):
        for u in self.units:
            if u.scope == scope and u.kind == kind and u.key == key and u.active:
                return u
        return None

    def nearest(self, scope, kind, v, content):
        best = (None, -1.0)
        for u in self.units:
            if u.scope == scope and u.kind == kind and u.active:
                sim = 1.0 if v is None and same_text(u.content, content) else float(np.dot(v, vec(u.content))) if v is not None else -1.0
                best = max(best, (u, sim), key=lambda p: p[1])
        return best


def plan_for(held: Held, *fresh: MemoryUnit, with_vectors: bool = True):
    items = [(u, vec(u.content) if with_vectors else None) for u in fresh]
    return consolidate(items, held.slot, held.nearest, dup_threshold=0.9)


def test_a_near_duplicate_of_a_held_unit_is_merged_not_inserted():
    old = unit("The user prefers tabs over spaces.", Kind.preference)
    plan = plan_for(Held(old), unit("the user PREFERS tabs over spaces", Kind.preference))
    assert not plan.inserts and not plan.supersessions
    assert [m.unit_id for m in plan.merges] == [old.unit_id]


def test_a_new_value_for_a_slot_supersedes_the_held_unit():
    old = unit("The user's editor is vim.", key="editor")
    new = unit("The user's editor is emacs.", key="editor")
    plan = plan_for(Held(old), new)
    (ins, _), = plan.inserts
    assert plan.supersessions == [(old.unit_id, ins.unit_id)] and ins.supersedes == old.unit_id
    assert ins.content == new.content and not plan.merges


def test_the_same_value_for_a_slot_is_a_merge():
    old = unit("The user's editor is vim.", key="editor")
    plan = plan_for(Held(old), unit("The user's editor is vim!", key="editor"))
    assert not plan.inserts and [m.unit_id for m in plan.merges] == [old.unit_id]


def test_a_slot_value_close_in_embedding_space_still_supersedes():
    """"vim" vs "vi": most words shared, cosine above the duplicate threshold, yet a different value."""
    old = unit("The user's favourite code editor for writing long python data scripts at work today is vim", key="editor")
    new = unit("The user's favourite code editor for writing long python data scripts at work today is vi", key="editor")
    assert float(vec(old.content) @ vec(new.content)) >= 0.9
    plan = plan_for(Held(old), new)
    assert not plan.merges and plan.supersessions == [(old.unit_id, plan.inserts[0][0].unit_id)]


def test_slots_and_duplicates_never_cross_scopes_or_kinds():
    held = Held(unit("The user's editor is vim.", key="editor", user="bob"),
                unit("The user prefers tabs over spaces.", Kind.preference))
    plan = plan_for(held, unit("The user's editor is emacs.", key="editor"),
                    unit("The user prefers tabs over spaces.", Kind.semantic))
    assert len(plan.inserts) == 2 and not plan.merges and not plan.supersessions


def test_within_one_batch_duplicates_merge_and_contradictions_supersede():
    a = unit("The user's editor is vim.", key="editor")
    b = unit("The user's editor is vim.", key="editor")
    c = unit("The user's editor is helix.", key="editor")
    d = unit("The user likes dark mode.", Kind.preference)
    e = unit("The user likes dark mode", Kind.preference)
    plan = plan_for(Held(), a, b, c, d, e)
    units = [u for u, _ in plan.inserts]
    assert [u.content for u in units] == [a.content, c.content, d.content]
    first, second, pref = units
    assert first.mentions == 2 and first.superseded_by == second.unit_id and second.supersedes == first.unit_id
    assert pref.mentions == 2 and not plan.merges and not plan.supersessions  # nothing held was touched


def test_without_vectors_only_the_same_text_is_a_duplicate():
    old = unit("The user uses Postgres 16.")
    plan = plan_for(Held(old), unit("The user uses postgres 16"), unit("The user uses Postgres 17."),
                    with_vectors=False)
    assert [m.unit_id for m in plan.merges] == [old.unit_id]
    assert [u.content for u, _ in plan.inserts] == ["The user uses Postgres 17."]


def test_same_text_ignores_case_accents_spacing_and_punctuation():
    assert same_text("Café  is   DONE.", "cafe is done")
    assert not same_text("cafe is done", "cafe is not done")
