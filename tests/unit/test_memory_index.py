"""The vector index math: exact top-k, the binary prefilter's recall, holes and compaction."""

from __future__ import annotations

import numpy as np

from memory.index import ScopeVectors, binary_codes, hamming, nearest, top_k
from memory.store import ScopeChanges


def unit_rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_top_k_is_sorted_and_breaks_ties_by_index():
    s = np.array([0.5, 0.9, 0.5, 0.1, 0.9])
    assert top_k(s, 3).tolist() == [1, 4, 0]
    assert top_k(s, 10).tolist() == [1, 4, 0, 2, 3]
    assert top_k(s, 0).tolist() == [] and top_k(np.zeros(0), 3).tolist() == []


def test_nearest_takes_the_m_smallest_distances_and_the_lower_indices_at_the_cut():
    d = np.array([5, 1, 3, 3, 0, 3, 7], dtype=np.uint16)
    assert nearest(d, 3).tolist() == [1, 2, 4]  # 0, 1, then the first of the three 3s
    assert nearest(d, 5).tolist() == [1, 2, 3, 4, 5]
    assert nearest(d, 0).tolist() == [] and nearest(d, 9).tolist() == list(range(7))
    rng = np.random.default_rng(3)
    for m in (1, 17, 256):
        x = rng.integers(0, 385, size=5000).astype(np.uint16)
        got = nearest(x, m)
        assert got.size == m and np.array_equal(got, np.sort(got))
        assert np.array_equal(np.sort(x[got]), np.sort(x)[:m])  # the same distances as a full sort's first m


def test_binary_codes_and_hamming_match_a_bitwise_reference():
    x = unit_rows(50, 100)
    codes = binary_codes(x)
    assert codes.shape == (50, 2) and codes.dtype == np.uint64
    ref = (x[:, None, :] > 0) != (x[None, 3, :] > 0)
    assert hamming(np.ascontiguousarray(codes.T), codes[3]).tolist() == ref.sum(axis=2)[:, 0].tolist()


def _sv(vecs: np.ndarray) -> ScopeVectors:
    sv = ScopeVectors(vecs.shape[1])
    sv.apply(ScopeChanges([(f"u{i}", "semantic", v.astype("<f4").tobytes(), True) for i, v in enumerate(vecs)],
                          [], 1, True))
    return sv


def test_the_binary_prefilter_keeps_recall_against_exact_search():
    """Clustered data like real embeddings (topics): recall@10 of prefilter+rescore vs exact >= 0.9."""
    rng = np.random.default_rng(1)
    centers = unit_rows(200, 384, seed=2)
    x = centers[rng.integers(0, 200, 20000)] + 0.08 * rng.standard_normal((20000, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sv = _sv(x)
    recall = []
    for qi in range(30):
        q = x[qi * 97] + 0.05 * rng.standard_normal(384).astype(np.float32)
        q /= np.linalg.norm(q)
        exact = {h[0] for h in sv.search(q, binary_codes(q[None])[0], 10, None, 10**9, 10, 256)}
        approx = {h[0] for h in sv.search(q, binary_codes(q[None])[0], 10, None, 0, 10, 256)}
        recall.append(len(exact & approx) / 10)
    assert np.mean(recall) >= 0.9


def test_removed_rows_are_holes_until_compaction_and_never_returned():
    x = unit_rows(8, 16)
    sv = _sv(x)
    sv.apply(ScopeChanges([], ["u0"], 2, False))
    assert len(sv) == 7 and len(sv.ids) == 8  # a hole
    hits = sv.search(x[0], binary_codes(x[:1])[0], 8, None, 100, 10, 256)
    assert "u0" not in [h[0] for h in hits] and len(hits) == 7
    sv.apply(ScopeChanges([("u1", "semantic", None, False), ("u2", "semantic", None, False)], [], 3, False))
    assert len(sv) == 5 and len(sv.ids) == 5  # 3 holes of 8 > a quarter: compacted
    assert {h[0] for h in sv.search(x[3], binary_codes(x[3:4])[0], 8, None, 100, 10, 256)} == {
        "u3", "u4", "u5", "u6", "u7"}
    assert sv.search(x[3], binary_codes(x[3:4])[0], 1, None, 100, 10, 256)[0] == ("u3", sv.search(
        x[3], binary_codes(x[3:4])[0], 1, None, 100, 10, 256)[0][1])


def test_search_by_kind_and_vectors_of_another_dimension_are_ignored():
    x = unit_rows(3, 16)
    sv = ScopeVectors(16)
    sv.apply(ScopeChanges([("a", "semantic", x[0].tobytes(), True), ("b", "preference", x[1].tobytes(), True),
                           ("c", "semantic", unit_rows(1, 8)[0].tobytes(), True)], [], 1, True))
    assert len(sv) == 2
    from memory.units import Kind

    assert [h[0] for h in sv.search(x[1], binary_codes(x[1:2])[0], 5, Kind.semantic, 100, 10, 256)] == ["a"]
