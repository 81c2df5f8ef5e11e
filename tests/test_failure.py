"""Failure closure in the spec: safe boundary, invalidation, bounded retries (issue 5, spec part)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvspec.spec.failure import compute_loaded_prefix, compute_retry_cap, compute_safe_boundary, is_block_kept
from kvspec.spec.geometry import compute_alignment, compute_group_ids
from kvspec.spec.invariants import compute_failure_violations
from kvspec.spec.lookup import compute_lookup
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario

from .support.strategies import scenarios


@st.composite
def failed_loads(draw):
    sc = draw(scenarios())
    out = evaluate_scenario(sc)
    ok = [draw(st.booleans()) if draw(st.integers(0, 3)) == 0 else True for _ in out.load]
    return sc, out, ok


@given(failed_loads())
def test_failure_registry(case):
    """F-1, F-2, F-3, F-4, F-7 of the registry hold for random partial load failures."""
    sc, out, ok = case
    assert compute_failure_violations(sc, out, tuple(ok)) == ()


@given(failed_loads())
def test_failure_closure(case):
    sc, out, ok = case
    g, h, E = sc.geometry, out.hit_length, out.present
    safe = compute_safe_boundary(g, E, h, out.load, ok)
    a = compute_alignment(g)
    assert 0 <= safe <= h and safe % a == 0  # F-1
    if all(ok):
        assert safe == h  # F-2: nothing failed, nothing lost
    for gid in compute_group_ids(g, "attention"):  # F-3: every attention prefix [0, safe) is loaded
        assert compute_loaded_prefix(g, gid, h, out.load, ok) >= safe
    if safe > 0:  # F-4: every Mamba group has a state stored at exactly the safe boundary
        assert all((m, safe) in E for m in compute_group_ids(g, "mamba"))
        if safe == h:
            assert all(good for e, good in zip(out.load, ok) if g.groups[e.group].kind == "mamba")
    # F-5: more failures never give a larger safe boundary
    worse = [good and k % 2 == 0 for k, good in enumerate(ok)]
    assert compute_safe_boundary(g, E, h, out.load, worse) <= safe
    # F-6: every attention block kept by the closure was loaded (a kept block never holds a failed load)
    assert all(good for e, good in zip(out.load, ok)
               if is_block_kept(e, safe) and g.groups[e.group].kind == "attention")
    # F-7: the retried lookup, capped at the safe boundary, never re-offers the failing hit
    if not all(ok):
        cap = compute_retry_cap(1, safe)
        again = compute_lookup(g, E, sc.prompt, cap=cap).hit_length
        assert again <= safe and (safe == h or again < h)


def test_retries_are_bounded():
    assert compute_retry_cap(0, 100) is None
    assert compute_retry_cap(1, 100) == 100 and compute_retry_cap(2, 100) == 100
    assert compute_retry_cap(3, 100) == 0  # past the budget: recompute from 0


def test_worked_example_attention_tail_failure_falls_back_to_0():
    g = get_preset("kimi-k3-dcp8")
    sc = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),), rules="pr53324")
    out = evaluate_scenario(sc)
    ok = [True, False, True]  # attention block 1 (key H_14848) evicted between lookup and load
    # attention loaded [0, 12288); the only Mamba states are 13824 and 14848: nothing stored below 12288
    assert compute_safe_boundary(g, out.present, out.hit_length, out.load, ok) == 0
    assert compute_safe_boundary(g, out.present, out.hit_length, out.load, [True, True, True]) == 13824


def test_shipped_engine_attention_tail_failure_falls_back_to_0():
    g = get_preset("kimi-k3-dcp8")
    sc = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),), rules="vllm-0.33.0")
    out = evaluate_scenario(sc)
    # vLLM 0.33.0 keeps one Mamba state (14848, the checkpoint): losing attention block 1 (H_14976) leaves nothing
    assert compute_safe_boundary(g, out.present, out.hit_length, out.load, [True, False, True]) == 0
    assert compute_safe_boundary(g, out.present, out.hit_length, out.load, [True, True, True]) == 14848


def test_closure_mutants_are_caught():
    g = get_preset("kimi-k3-dcp8")
    sc = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),))
    out = evaluate_scenario(sc)
    ok = (True, False, True)
    from kvspec.checks.verify.mutants import MUTANTS
    by_name = {m.name: m.vary_scenario(sc) for m in MUTANTS}  # the scenario under each mutant's rule set
    assert "F-3" in compute_failure_violations(by_name["closure-keeps-hit"], out, ok)  # keeps the hit
    assert "F-7" in compute_failure_violations(by_name["closure-retry-same-hit"], out, ok)  # same hit again
    assert not compute_failure_violations(sc, out, ok)


def test_retry_is_the_rule_sets_own_capped_lookup():
    """F-7's retry runs the rule set's lookup (its geometry and λ), not the raw one: under hash lookahead no EAGLE drop,
    so after the Mamba block fails the retry reuses the safe boundary 1 (the raw geometry's drop would make it 0)."""
    from kvspec.spec.geometry import Geometry, Group, Parallel
    from kvspec.spec.invariants import compute_failure_witness
    g = Geometry(unit=1, groups=(Group(kind="attention", block_size=1, eagle=True), Group(kind="mamba", block_size=1)),
                 parallel=Parallel(dcp=1), retention="dense")
    sc = Scenario(geometry=g, prompt=3, stored=(StoredRequest(prompt=2, shared=1), StoredRequest(prompt=4, shared=3)),
                  rules="vllm-0.33.0-lookahead")
    out = evaluate_scenario(sc)
    ok = (True, False, True)  # the Mamba block fails
    w = compute_failure_witness(sc, out, ok)
    assert (w.safe, w.retry_hit) == (1, 1)
    assert compute_lookup(g, out.present, 3, cap=w.safe).hit_length == 0  # what the raw geometry's drop would give
    assert not compute_failure_violations(sc, out, ok)


def test_lookup_deadline_and_breaker():
    """vLLM 0.34.0's lookup deadline and breaker, stated (spec/failure.py; its own code agrees in
    tests/test_vllm_conformance.py): three timeouts open the breaker — the next lookups within 30 s answer 0 without
    asking — then one probe runs; its answer closes the breaker."""
    from kvspec.spec.failure import Breaker, LookupCall, compute_lookup_hits
    slow, fast = 1.5, 0.1
    calls = [LookupCall(start_s=t, answer_s=a) for t, a in
             ((0, slow), (2, slow), (4, slow), (6, fast), (20, fast), (36, fast), (38, fast))]
    assert compute_lookup_hits(calls, [7] * 7) == (0, 0, 0, 0, 0, 7, 7)
    err = [LookupCall(start_s=0, answer_s=fast, error=True), LookupCall(start_s=2, answer_s=fast)]
    assert compute_lookup_hits(err, [5, 5]) == (0, 5)  # an error is a failure; a success resets the count
    assert compute_lookup_hits(calls[:4], [7] * 4, Breaker(threshold=4)) == (0, 0, 0, 7)
