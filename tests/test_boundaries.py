"""spec/boundaries.py against explicit sets: every operation the compact spec uses, on random runs, points and holes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvspec.spec.boundaries import (
    compute_at_most,
    compute_intersection,
    compute_union,
    compute_whole_run,
    compute_without,
    count_boundaries,
    find_max,
    find_min,
    has_boundary,
    iterate_boundaries,
    make_boundaries,
    make_objects,
)

runs = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 9), st.integers(0, 12)).map(
    lambda t: (t[0], t[1], t[0] + t[1] * t[2])), max_size=3)
sets = st.builds(lambda r, p: make_boundaries(p, r), runs, st.lists(st.integers(1, 150), max_size=6))


def explicit(b):
    return {x for f, s, last in b.runs for x in range(f, last + 1, s)} | set(b.points)


@given(sets, sets, st.lists(st.integers(1, 150), max_size=5), st.integers(0, 150), st.integers(0, 150),
       st.integers(1, 12), st.integers(1, 12))
def test_boundaries_equal_explicit_sets(a, b, removed, lo, hi, mod, span):
    ea, eb = explicit(a), explicit(b)
    assert list(iterate_boundaries(a)) == sorted(ea) and count_boundaries(a) == len(ea)
    u = compute_union(a, b)
    assert set(iterate_boundaries(u)) == ea | eb and count_boundaries(u) == len(ea | eb)
    ha = compute_without(a, removed)
    eha = ea - set(removed)
    assert set(iterate_boundaries(ha)) == eha and count_boundaries(ha) == len(eha)
    assert all(has_boundary(ha, x) == (x in eha) for x in range(160))
    i = compute_intersection(ha, b)
    assert set(iterate_boundaries(i)) == eha & eb and count_boundaries(i) == len(eha & eb)
    assert set(iterate_boundaries(compute_at_most(ha, hi))) == {x for x in eha if x <= hi}
    window = [x for x in eha if lo < x <= hi and x % mod == 0]
    assert find_max(ha, lo, hi, mod) == max(window, default=None)
    assert find_min(ha, lo, hi, mod) == min(window, default=None)
    k = 0
    while (k + 1) * span in eha:
        k += 1
    assert compute_whole_run(ha, span) == k


def test_objects_is_a_set_of_group_boundary_pairs():
    o = make_objects({0: make_boundaries((5,), ((4, 4, 12),)), 1: make_boundaries((3,))})
    assert set(o) == {(0, 4), (0, 5), (0, 8), (0, 12), (1, 3)} and len(o) == 5 and (0, 8) in o and (1, 4) not in o
    assert o == frozenset(o) and frozenset(o) == o and sorted(o)[0] == (0, 4)
