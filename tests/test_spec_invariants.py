"""The invariant registry on the executable spec, by Hypothesis; the legacy rule must fail I-20."""

from __future__ import annotations

from hypothesis import Phase, example, find, given, note, settings
from hypothesis import strategies as st

from kvspec.spec.invariants import REGISTRY, compute_violations
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario

from .support.strategies import arbitrary_present_scenarios, scenarios

KIMI = Scenario(geometry=get_preset("kimi-k3-dcp8"), prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),))


@given(scenarios())
@example(KIMI)
def test_registry_holds_on_random_scenarios(sc):
    """Every scenario invariant (I-12, I-SHARED, I-14, I-15, I-18, I-19, I-20, I-22) and I-21 hold."""
    out = evaluate_scenario(sc)
    note(f"h={out.hit_length} tails={out.tails}")
    assert out.error is None, out.error
    assert compute_violations(sc, out) == ()


@given(arbitrary_present_scenarios())
def test_tail_key_missing_unreachable_from_any_present_set(sc):
    """'No tail key found' cannot happen for any E, however objects were evicted (I-18)."""
    out = evaluate_scenario(sc)
    assert out.error is None, out.error
    assert compute_violations(sc, out) == ()


@given(st.one_of(scenarios(), arbitrary_present_scenarios()))
def test_the_hit_alone_is_the_evaluations_hit(sc):
    """compute_hit (the property rows' h: the lookup without tails and plan) is evaluate_scenario's h."""
    from kvspec.spec.scenario import compute_hit
    assert compute_hit(sc) == evaluate_scenario(sc).hit_length


def test_every_scenario_invariant_is_exercised():
    ids = {inv.id for inv in REGISTRY if inv.kind == "scenario"}
    assert {"I-12", "I-14", "I-15", "I-18", "I-19", "I-20", "I-SHARED"} <= ids


def test_legacy_rule_fails_I20_with_shrunk_counterexample():
    """The pre-#53324 loader (tail keyed at h) breaks I-20; Hypothesis finds and shrinks a counterexample."""
    def breaks(sc: Scenario) -> bool:
        out = evaluate_scenario(sc)
        return "I-20" in compute_violations(sc, out)

    found = find(scenarios(rules="legacy", evict=False), breaks,
                 settings=settings(max_examples=2000, database=None, phases=[Phase.generate, Phase.shrink]))
    out = evaluate_scenario(found)
    bad = [e for e in out.load if not e.present]
    print("legacy counterexample:", found, "->", bad)
    assert bad and all(e.key_boundary == out.hit_length for e in bad)
    assert found.geometry.parallel.dcp > 1 or len({g.block_size for g in found.geometry.groups}) > 1


def test_legacy_breaks_the_worked_example_and_fixed_does_not():
    legacy = Scenario(geometry=KIMI.geometry, prompt=15000, stored=KIMI.stored, rules="legacy")
    assert compute_violations(legacy, evaluate_scenario(legacy)) == ("I-19", "I-20")
    assert compute_violations(KIMI, evaluate_scenario(KIMI)) == ()


def test_full_prompt_hit_is_rederived_below_n():
    # A longer stored request covers all 16 tokens of the lookup: the hit must leave one token to compute,
    # and is re-derived against the stored boundaries (#49481), not clamped to N-1 arithmetically (#43494).
    from kvspec.spec.geometry import make_geometry
    g = make_geometry(1, [("attention", 4, False), ("mamba", 4, False)], dcp=2, retention="dense")
    sc = Scenario(geometry=g, prompt=16, stored=(StoredRequest(prompt=24, shared=16),))
    out = evaluate_scenario(sc)
    assert out.lookup.rederived and out.lookup.bound == 15 and out.hit_length == 8
    assert compute_violations(sc, out) == ()


@given(scenarios(evict=False))
def test_store_boundaries_lie_in_their_blocks(sc):
    """I-6/I-7/I-8/I-9 on the executable store rule, through the registered I-6 predicate."""
    from kvspec.spec.geometry import compute_lcm_span, compute_span
    from kvspec.spec.invariants import get_invariant
    from kvspec.spec.ops import IntOps
    from kvspec.spec.store import compute_store_boundaries, compute_sub_block_tail, is_tail_stored

    g = sc.geometry
    inv = get_invariant("I-6")
    for r in sc.stored:
        p = r.prompt
        full = p // compute_lcm_span(g) * compute_lcm_span(g)
        tail = compute_sub_block_tail(g, p)
        for gid, t in compute_store_boundaries(g, p):
            s = compute_span(g, gid)
            assert 0 < t <= p and t % g.unit == 0
            if g.groups[gid].kind == "attention":  # a full block at k*s <= F, or a block keyed min((i+1)s, T)
                assert (t % s == 0 and t <= full) or (is_tail_stored(g, p) and t <= tail)
                vals = dict(u=g.unit, s=s, tail=max(tail, t), i=-(-t // s) - 1)
                assert inv.pre(IntOps, **vals) and inv.predicate(IntOps, **vals)
            else:  # a checkpoint (multiple of b, <= P-1) or the sub-block tail
                b = g.groups[gid].block_size
                assert (t % b == 0 and t <= p - 1) or (t == tail and is_tail_stored(g, p))


@given(st.integers(1, 4), st.sets(st.tuples(st.integers(0, 2), st.integers(1, 12)), max_size=10),
       st.sets(st.tuples(st.integers(0, 2), st.integers(1, 12), st.integers(-1, 5)), max_size=8))
def test_present_after_evictions_is_present_over_rank_shards(d, objects, evicted):
    """E from the objects less those with an evicted shard (the fast form) equals E over the explicit rank shards."""
    from kvspec.spec.geometry import make_geometry
    from kvspec.spec.store import compute_present, compute_present_after, compute_rank_objects
    g = make_geometry(1, [("attention", 4, False)], dcp=d)
    objs = frozenset(objects)
    assert compute_present_after(g, objs, frozenset(evicted)) == \
        compute_present(g, compute_rank_objects(g, objs) - frozenset(evicted))


def test_equal_verdict_keys_give_equal_evaluations_across_rule_sets():
    """make verify's exhaustive passes give a scenario the verdict of an earlier one with the same verdict key: the key
    must hold everything the evaluation, the registry and the failure closure read (tail rule, λ and store rule
    included), under every rule set, legacy and its I-20 violations too."""
    import attrs

    from kvspec.checks.verify.exhaustive import SCOPE_SMALL
    from kvspec.spec.invariants import (
        compute_failure_violations,
        compute_failure_witness,
        compute_keyed_violations,
        compute_verdict_key,
    )
    from kvspec.spec.rules import RULE_SETS

    shared = violated = 0
    for g in SCOPE_SMALL.sample(5, 97):
        seen: dict = {}
        for rules in RULE_SETS:
            for sc in attrs.evolve(SCOPE_SMALL, rules=rules).scenarios(g):
                out = evaluate_scenario(sc)
                failures = []  # each load result: the closure's violations, safe boundary and retry
                for ok in [(True,) * len(out.load)] + [tuple(j != k for j in range(len(out.load)))
                                                       for k in range(len(out.load))]:
                    fw = compute_failure_witness(sc, out, ok)
                    failures.append((compute_failure_violations(sc, out, ok), fw.safe, fw.retry_hit,
                                     fw.attention_loaded))
                verdict = (out.present, out.lookup, out.tails, out.load, out.error,
                           compute_keyed_violations(sc, out)[1], tuple(failures))
                first = seen.setdefault(compute_verdict_key(sc), (sc, verdict))
                assert first[1] == verdict, (first[0], sc)
                shared += first[0].rules != sc.rules
                violated += bool(verdict[-2])
    assert shared > 1000 and violated > 0  # rule sets do share verdicts, violations among them


def test_only_the_invariants_marked_reads_shared_read_the_shared_prefix():
    """The verdict key leaves the shared prefix out, so an invariant not marked reads_shared must give the same verdict
    whatever the witness's shared prefix; the marked ones are judged per scenario (I-SHARED refutes a prefix below h)."""
    import attrs

    from kvspec.checks.verify.exhaustive import SCOPE_SMALL
    from kvspec.spec.invariants import compute_keyed_violations, compute_shared_violations
    from kvspec.spec.ops import IntOps

    marked, judged, refuted = {inv.id for inv in REGISTRY if inv.reads_shared}, 0, 0
    assert marked == {"I-SHARED"}
    for g in SCOPE_SMALL.sample(3, 131):
        for sc in SCOPE_SMALL.scenarios(g):
            w, _ = compute_keyed_violations(sc, evaluate_scenario(sc))
            for inv in REGISTRY:
                if inv.kind not in ("scenario", "maximal") or inv.reads_shared:
                    continue
                first = inv.predicate(IntOps, w)
                for s in (0, w.hit - 1, w.hit, w.prompt + 7):
                    assert inv.predicate(IntOps, attrs.evolve(w, shared=s)) == first, (inv.id, sc, s)
                judged += 1
            if w.hit > 0:
                refuted += compute_shared_violations(w, w.hit - 1) == ("I-SHARED",)
    assert judged > 10000 and refuted > 100
