"""Geometry: one test per validation rule, derived quantities, presets, ownership."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import (
    Geometry,
    Group,
    compute_alignment,
    compute_lcm_span,
    compute_span,
    is_fine,
    make_geometry,
)
from kvspec.spec.invariants import get_invariant
from kvspec.spec.ops import IntOps
from kvspec.spec.ownership import compute_owner, compute_rank_positions
from kvspec.spec.presets import PRESETS, get_preset

from .support.strategies import geometries


def rule_of(fn) -> str:
    with pytest.raises(SpecError) as ei:
        fn()
    return ei.value.rule


def test_rule_unit_divides_span():
    """u divides every group's span (b·D for attention, b for Mamba), as vLLM asks; not necessarily b."""
    assert rule_of(lambda: make_geometry(128, [("attention", 1536, False), ("mamba", 1000, False)], 8)) \
        == "unit-divides-span"
    assert make_geometry(32, [("attention", 16, False)], dcp=2).unit == 32  # b·D = 32 hashes every 32 tokens
    assert rule_of(lambda: make_geometry(32, [("attention", 16, False)], dcp=1)) == "unit-divides-span"


def test_rule_dcp_positive():
    assert rule_of(lambda: make_geometry(1, [("attention", 4, False)], dcp=0)) == "dcp-positive"


def test_rule_pcp_single_kind():
    assert rule_of(lambda: make_geometry(1, [("attention", 4, False), ("mamba", 4, False)], pcp=2)) \
        == "pcp-single-kind"
    make_geometry(1, [("attention", 4, False)], pcp=2)  # one kind: allowed


def test_rule_interleave_on_hybrid_dcp():
    assert rule_of(lambda: make_geometry(1, [("attention", 4, False), ("mamba", 4, False)], dcp=2,
                                         interleave=2)) == "hybrid-dcp-interleave"
    make_geometry(1, [("attention", 4, False)], dcp=2, interleave=2)  # attention-only: allowed
    make_geometry(1, [("attention", 4, False), ("mamba", 4, False)], dcp=1, interleave=2)  # no DCP: allowed


def test_rule_interleave_divides_block():
    assert rule_of(lambda: make_geometry(1, [("attention", 6, False)], dcp=2, interleave=4)) \
        == "interleave-divides-block"


def test_rule_groups_nonempty():
    assert rule_of(lambda: Geometry(unit=1, groups=())) == "groups-nonempty"


def test_rule_unknown_kind():
    assert rule_of(lambda: Group(kind="sliding_window", block_size=4)) == "group-kind"


def test_rule_positive_and_integer_fields():
    assert rule_of(lambda: Group(kind="mamba", block_size=0)) == "block-size-positive"
    assert rule_of(lambda: Group(kind="mamba", block_size=True)) == "integer-field"
    assert rule_of(lambda: make_geometry(0, [("mamba", 4, False)])) == "unit-positive"
    assert rule_of(lambda: make_geometry(1, [("mamba", 4, False)], retention="sometimes")) == "retention"


def test_validators_run_on_evolve():
    g = get_preset("kimi-k3-dcp8")
    with pytest.raises(SpecError):
        attrs.evolve(g, unit=1000)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        g.unit = 1  # type: ignore[misc]


def test_kimi_derived_quantities():
    g = get_preset("kimi-k3-dcp8")
    assert [compute_span(g, i) for i in range(2)] == [12288, 1536]
    assert compute_lcm_span(g) == 12288 and is_fine(g) and compute_alignment(g) == 128


def test_fine_condition():
    # D = 1 needs b > u; D > 1 accepts b = u.
    assert not is_fine(make_geometry(4, [("attention", 4, False), ("mamba", 4, False)], dcp=1))
    assert is_fine(make_geometry(4, [("attention", 4, False), ("mamba", 8, False)], dcp=1))
    assert is_fine(make_geometry(4, [("attention", 4, False), ("mamba", 4, False)], dcp=2))
    g = make_geometry(4, [("attention", 4, False), ("mamba", 4, False)], dcp=1)
    assert compute_alignment(g) == compute_lcm_span(g) == 4
    assert not is_fine(make_geometry(4, [("attention", 8, False)], dcp=2))  # no Mamba: never fine


def test_presets_valid():
    for name, g in PRESETS.items():
        assert get_preset(name) is g
    with pytest.raises(SpecError):
        get_preset("nope")


@given(geometries())
def test_spans_aligned_on_generated_geometries(g):
    """I-1/2 on the executable geometry, through the registered predicate."""
    inv = get_invariant("I-1/2")
    lcm = compute_lcm_span(g)
    for a in (i for i, gr in enumerate(g.groups) if gr.kind == "attention"):
        for m in (i for i, gr in enumerate(g.groups) if gr.kind == "mamba"):
            vals = dict(u=g.unit, ba=g.groups[a].block_size, bm=g.groups[m].block_size, d=g.parallel.dcp, lcm=lcm)
            assert inv.pre(IntOps, **vals) and inv.predicate(IntOps, **vals)
            assert compute_span(g, a) == vals["ba"] * vals["d"] and compute_span(g, m) == vals["bm"]


@given(st.sampled_from([1, 2, 4, 8]), st.integers(1, 8), st.integers(1, 6), st.data())
def test_ownership_bijection(d, il, q, data):
    """I-4 and I-4p on the executable ownership map: a bijection, slots monotone per rank."""
    b = il * q
    s = b * d
    pairs = [compute_owner(o, s, d, il) for o in range(s)]
    assert sorted(pairs) == [(r, sl) for r in range(d) for sl in range(b)]
    o1, o2 = data.draw(st.integers(0, s - 1)), data.draw(st.integers(0, s - 1))
    for inv_id in ("I-4", "I-4p"):
        inv = get_invariant(inv_id)
        assert inv.predicate(IntOps, d=d, il=il, b=b, o1=o1, o2=o2)
    assert compute_owner(o1, s, d, il) == compute_owner(o1 + s, s, d, il)  # every block is laid out alike


def test_ownership_example_dcp8():
    # DCP 8, I = 1: rank 2 owns positions 2 and 10 at slots 0 and 1.
    assert compute_owner(2, 16, 8, 1) == (2, 0) and compute_owner(10, 16, 8, 1) == (2, 1)
    assert compute_rank_positions(0, 16, 8, 1, 2) == (2, 10)
    # I = 128, span 256, D = 2: positions 0..127 rank 0, 128..255 rank 1.
    assert compute_owner(127, 256, 2, 128) == (0, 127) and compute_owner(128, 256, 2, 128) == (1, 0)
