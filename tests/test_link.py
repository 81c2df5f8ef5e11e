"""The link: the closed forms the theorems are proved on equal the executable spec (lookup, safe boundary), under
each rule set's store rule."""

from __future__ import annotations

from kvspec.checks.verify.closed_form import Params
from kvspec.checks.verify.link import compare


def test_link_on_the_worked_example():
    assert compare(Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000)) is None
    assert compare(Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000), draft=True) is None


def test_failure_link_on_a_small_scope():
    from kvspec.checks.verify.link import LINK_SCOPE, compare_failure
    assert all(compare_failure(x) is None for k, x in enumerate(LINK_SCOPE.iterate()) if k % 97 == 0)


def test_link_under_vllm_rules():
    """The closed form of vLLM 0.33.0's store rule equals the spec: the worked example and a slice of the scope."""
    from kvspec.checks.verify.link import LINK_SCOPE
    x = Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000)
    assert compare(x, rule="vllm-0.33.0") is None and compare(x, draft=True, rule="vllm-0.33.0") is None
    assert all(compare(x, rule="vllm-0.33.0") is None for k, x in enumerate(LINK_SCOPE.iterate()) if k % 101 == 0)
    # and the two rule sets' closed forms differ (the link would catch a closed form of the wrong rule)
    from kvspec.checks.verify.closed_form import compute_closed_form
    from kvspec.spec.ops import IntOps
    assert compute_closed_form(IntOps, x, "vllm-0.33.0")[0].hit != compute_closed_form(IntOps, x)[0].hit


def test_link_under_lookahead_rules():
    """The closed form with hash lookahead (λ = 1: no EAGLE drop, hashes stop at ⌊(P−1)/u⌋, visibility t + 1 <= S, the
    lookup bound ⌊(N−1)/u⌋) equals the spec on a slice of the scope, and differs from vLLM 0.33.0's where it should."""
    from kvspec.checks.verify.closed_form import compute_closed_form
    from kvspec.checks.verify.link import LINK_SCOPE
    from kvspec.spec.ops import IntOps
    rule = "vllm-0.33.0-lookahead"
    assert all(compare(x, rule=rule) is None for k, x in enumerate(LINK_SCOPE.iterate()) if k % 101 == 0)
    x = Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000)
    assert compare(x, rule=rule) is None and compare(x, draft=True, rule=rule) is None
    # the worked example: no EAGLE drop, so the resend hits one unit deeper than under vLLM 0.33.0
    assert compute_closed_form(IntOps, x, rule)[0].hit == compute_closed_form(IntOps, x, "vllm-0.33.0")[0].hit + 1


def test_failure_link_per_rule_set():
    """Each rule set's closed safe boundary equals spec/failure.py on a slice of the scope, and the pinned case where
    the first vLLM link differed: a safe boundary taken at the PR's replay point R (u = 1, b = 2, D = 2, EAGLE, replay,
    P = N = S = 4) where vLLM 0.33.0's EAGLE retention keeps only R1, R2 and the checkpoint C."""
    from kvspec.checks.verify.closed_form import compute_closed_form, compute_closed_safe
    from kvspec.checks.verify.link import LINK_SCOPE, compare_failure
    from kvspec.spec.ops import IntOps
    for rule in ("vllm-0.33.0", "vllm-0.33.0-lookahead"):
        assert all(compare_failure(x, rule) is None for k, x in enumerate(LINK_SCOPE.iterate()) if k % 97 == 0)
    x = Params(u=1, q=2, d=2, e=1, dense=0, p=4, n=4, s_shared=4)
    assert compare_failure(x, "vllm-0.33.0") is None
    cf, _, _ = compute_closed_form(IntOps, x, "vllm-0.33.0")
    assert cf.hit > 0 and cf.replay == 2  # R = 2 is not a state vLLM keeps here: the Mamba block failing leaves 0
    assert compute_closed_safe(IntOps, x, cf, -1, 0)[0] == 0


def test_link_over_the_states_a_schedule_left():
    """The closed form over Mamba states (what the any-schedule theorems quantify over) equals the spec under a chunk
    schedule, on the issue's case (P = 26000 under a 32768 budget, dense retention, a request sharing 20000: the states
    at 23040 and 25856 only, hit 0 against the block schedule's 10752) and on a slice of the link scope; the same
    closed form handed the block schedule's states disagrees with the spec under the budget (the link can fail)."""
    import attrs

    from kvspec.checks.verify.closed_form import StateSet, compute_closed_form
    from kvspec.checks.verify.link import (
        LINK_SCOPE_SCHEDULES,
        build_scenario,
        compare_outcome,
        compare_schedule,
        compute_stored_states,
    )
    from kvspec.spec.ops import IntOps
    from kvspec.spec.scenario import evaluate_scenario
    from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule
    rule, budget = "vllm-0.33.0", Schedule(budget=32768)
    x = Params(u=128, q=12, d=8, e=1, dense=1, p=26000, n=26000, s_shared=20000)
    assert compare_schedule(x, budget, rule=rule) is None and compare_schedule(x, BLOCK_SCHEDULE, rule=rule) is None
    sc = build_scenario(x, rule=rule)
    assert {128 * t for t in compute_stored_states(x, sc, budget)} == {23040, 25856}  # C = 25856 (EAGLE)
    assert compute_closed_form(IntOps, x, rule)[0].hit * 128 == 10752
    assert compute_closed_form(IntOps, attrs.evolve(x, states=StateSet(compute_stored_states(x, sc, budget))),
                               rule)[0].hit == 0
    block = attrs.evolve(x, states=StateSet(compute_stored_states(x, sc, BLOCK_SCHEDULE)))
    under_budget = attrs.evolve(sc, schedule=budget)
    assert compare_outcome(block, False, compute_closed_form(IntOps, block, rule)[0], under_budget,
                           evaluate_scenario(under_budget)) is not None
    for r in ("vllm-0.33.0", "vllm-0.33.0-lookahead"):
        assert all(compare_schedule(x, s, rule=r) is None for k, x in enumerate(LINK_SCOPE_SCHEDULES.iterate())
                   if k % 53 == 0 for s in LINK_SCOPE_SCHEDULES.schedules)
