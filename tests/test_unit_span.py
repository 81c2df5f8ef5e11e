"""A prefix-match unit that divides the span b·D but not the per-rank block b (vLLM accepts it under DCP): the spec's
invariant registry holds on such scenarios under every vLLM-family rule set, and the implementation's rules (the IMPL
adapter) agree with the spec. vLLM's own code agrees too (tests/test_vllm_conformance.py::
test_units_past_the_per_rank_block_are_vllms). The Z3 chains are stated for u | b: these geometries are checked on
ints only."""

from __future__ import annotations

import random

from kvspec.checks.conform.adapters import IMPL, compare_adapter
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.invariants import compute_violations
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario


def test_registry_and_implementation_where_the_unit_spans_ranks():
    rng = random.Random(4)
    n = 0
    for rules in ("pr53324", "vllm-0.33.0", "vllm-0.33.0-lookahead", "vllm-0.34.0"):
        for _ in range(250):
            d, b = rng.choice([2, 4, 8]), rng.choice([1, 2, 4, 8])
            u = b * rng.choice([k for k in (2, 4, 8) if d % k == 0])
            groups = [Group(kind="attention", block_size=b, eagle=rng.random() < 0.4)]
            if rng.random() < 0.7:
                groups.append(Group(kind="mamba", block_size=u * rng.choice([1, 2, 3])))
            if rng.random() < 0.2:
                groups.append(Group(kind="attention", block_size=b * rng.choice([1, 2])))
            try:
                g = Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=d),
                             retention=rng.choice(["replay", "dense"]))
                nn = rng.randint(1, 16 * u)
                stored = []
                for _ in range(rng.choice([1, 2])):
                    p = rng.randint(1, 16 * u)
                    stored.append(StoredRequest(prompt=p, shared=rng.randint(0, min(p, nn))))
                sc = Scenario(geometry=g, prompt=nn, stored=tuple(stored), rules=rules)
            except SpecError:
                continue  # a lone group whose unit is not its span (vLLM refuses it too)
            out = evaluate_scenario(sc)
            assert out.error is None and compute_violations(sc, out) == (), sc
            assert compare_adapter(IMPL, sc) is None, sc
            n += 1
    assert n > 700
