"""Cache-efficiency properties of a rule set, checked over a scope: the best hit, the resend closed form, monotonicity.

Safety says a rule never loads a wrong key; these say how much of the cache it uses. Each property
yields, per instance of the scope, whether it holds and the scenario that shows it; `make verify`
rows state per rule set whether the property holds (or is refuted, with a runnable counterexample).

* ``BEST`` — h equals the physical best (``spec/lookup.py: compute_physical_best``: the largest
  multiple of a below N that E can serve, tail keys up to ⌊N/u⌋·u). h above it would be unsafe and
  fails every row; h below it is cache left unused.
* ``RESEND`` — an identical resend hits ``compute_resend_best`` (⌊(P−1)/a⌋·a; with EAGLE
  max(⌊P/a⌋·a − a, 0)), every P up to 2L + 2u.
* ``MONO-PREFIX`` — a longer shared prefix never lowers the hit.
* ``MONO-EVICT`` — evicting one rank's shard of a stored object never raises the hit (every reader N <= P).
* ``MONO-MORE`` — storing one more request never lowers the hit.
* ``CONTENT`` — every loaded byte equals what the reader computes itself (``spec/content.py``): the
  draft-KV hazard is a refutation under the legacy hashes, closed by hash lookahead.
* ``COMPACT`` — the spec answered on runs and points (spec/boundaries.py), as scenarios past the explicit
  limit are, equals the explicit spec on every scenario: E, h, tails, load plan, error.
* ``FINISHED`` — writers that decoded, with and without save_decode_cache, read by a lookup continuing their
  conversation: every invariant holds and every loaded byte is the reader's own (spec/README.md "Deferred saves").
* ``SPLIT`` — a rule set whose λ applies only with a drafter (``vllm-0.34.0``) equals its predecessor
  without one and its λ-everywhere sibling with one, scenario by scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import attrs

from kvspec.checks.verify.exhaustive import compute_lengths, iterate_scenarios
from kvspec.spec.content import compute_wrong_positions
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, compute_lcm_span
from kvspec.spec.invariants import compute_plan_violations, compute_verdict_key, compute_violations
from kvspec.spec.lookup import compute_physical_best, compute_resend_best
from kvspec.spec.rules import (
    LOOKAHEAD_ALWAYS,
    RULE_SETS,
    RuleSet,
    coerce_rules,
    compute_lookahead,
    compute_rule_geometry,
)
from kvspec.spec.scenario import (
    RULE_DECODED,
    Outcome,
    Scenario,
    StoredRequest,
    compute_scenario_lookup,
    compute_scenario_present,
    compute_stages,
    evaluate_scenario,
)
from kvspec.spec.schedule import BLOCK_SCHEDULE
from kvspec.spec.store import Obj, compute_visible
from kvspec.spec.types import Rank, Tokens


@attrs.frozen
class Instance:
    """One instance of a property: whether it holds, the scenario that shows it, what was compared."""

    holds: bool
    scenario: Scenario
    what: str
    above_best: bool = False  # a hit above the best E allows: unsafe, whatever the property expects


class Memo:
    """A scenario's hit, outcome and physical best under its rule set (a mutant's too), each computed once per verdict
    key (spec/invariants.py: compute_verdict_key: all that the evaluation reads of a scenario, the rule set's replaced
    steps included) — a pass over several rule sets shares them."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], Any] = {}

    def _get(self, what: str, sc: Scenario, compute: Callable[[Scenario], Any]) -> Any:
        key = (what, *compute_verdict_key(sc))
        if key not in self._seen:
            self._seen[key] = compute(sc)
        return self._seen[key]

    def hit(self, sc: Scenario) -> int:
        """Return h (the lookup alone: spec/scenario.py: compute_scenario_lookup)."""
        return int(self._get("hit", sc, lambda x: compute_scenario_lookup(x)[2].hit_length))

    def outcome(self, sc: Scenario) -> Outcome:
        """Return the whole evaluation (lookup, tails, plan)."""
        return cast(Outcome, self._get("outcome", sc, evaluate_scenario))

    def best(self, sc: Scenario) -> int:
        """Return the physical best E allows (spec/lookup.py: compute_physical_best)."""
        return int(self._get("best", sc, _physical_best))

    def store(self, rules: RuleSet, g: Geometry, p: int) -> frozenset[Obj]:
        """Return the objects one request of P tokens stores under the rule set (its store step)."""
        return compute_stages(rules).store(rules, g, Tokens(p), BLOCK_SCHEDULE)


def _physical_best(sc: Scenario) -> Tokens:
    rs = sc.rules
    return compute_physical_best(compute_rule_geometry(rs, sc.geometry), compute_scenario_present(sc),
                                 Tokens(sc.prompt), compute_lookahead(rs, sc.geometry))


def iterate_best(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per scenario of the geometry's scope, whether h equals the physical best ("above" marks a safety bug)."""
    for sc in iterate_scenarios(g, rules=rules):
        h, best = memo.hit(sc), memo.best(sc)
        yield Instance(h == best, sc, f"h {h} vs best {best}", above_best=h > best)


def iterate_resend(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per P up to 2L + 2u, whether an identical resend hits compute_resend_best."""
    lookahead = compute_lookahead(coerce_rules(rules), g)
    for p in range(1, 2 * compute_lcm_span(g) + 2 * g.unit + 1):
        sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules=rules)
        h, best = memo.hit(sc), int(compute_resend_best(g, Tokens(p), lookahead))
        yield Instance(h == best, sc, f"h {h} vs best {best}", above_best=h > best)


def iterate_mono_prefix(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per P and consecutive shared prefixes S < S', whether the hit at S' is at least the hit at S."""
    lens = compute_lengths(g, 3)
    for p in (x for x in lens if x >= 1):
        prev = None
        for s in sorted({t for t in lens if t <= p} | {p}):
            sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=s),), rules=rules)
            h = memo.hit(sc)
            if prev is not None:
                yield Instance(h >= prev[1], sc, f"S {prev[0]} -> {s}: h {prev[1]} -> {h}")
            prev = (s, h)


def iterate_mono_evict(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per stored P, reader N <= P (sharing all N) and stored object, whether evicting its last rank's shard
    leaves the hit at most as it was."""
    last = Rank(g.parallel.dcp - 1)
    lens = [x for x in compute_lengths(g, 3) if x >= 1]
    rs = coerce_rules(rules)
    for p in lens:
        for n in (x for x in lens if x <= p):
            stored = (StoredRequest(prompt=p, shared=n),)
            base = memo.hit(Scenario(geometry=g, prompt=n, stored=stored, rules=rules))
            for gid, t in sorted(compute_visible(memo.store(rs, g, p), Tokens(n), compute_lookahead(rs, g))):
                sc = Scenario(geometry=g, prompt=n, stored=stored, evicted=frozenset({(gid, t, last)}), rules=rules)
                h = memo.hit(sc)
                yield Instance(h <= base, sc, f"evicting ({gid}, {t}): h {base} -> {h}")


def iterate_mono_more(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per P and a second stored request Q (sharing all or half of min(P, Q)), whether the hit does not drop."""
    lens = [x for x in compute_lengths(g, 3) if x >= 1]
    for p in lens:
        base = memo.hit(Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules=rules))
        for q in (x for x in lens if x != p):
            for sq in sorted({min(q, p), min(q, p) // 2 // g.unit * g.unit}):
                sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),
                                                            StoredRequest(prompt=q, shared=sq)), rules=rules)
                h = memo.hit(sc)
                yield Instance(h >= base, sc, f"storing {q} tokens sharing {sq}: h {base} -> {h}")


def iterate_finished(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per stored prompt of the geometry's scope, writers that decoded O ∈ {1, 2, L + 1} tokens, with and
    without save_decode_cache, read by a lookup continuing through every output (and, evicted, without one stored
    object's shard): whether the answer keeps every scenario invariant (MAX-HIT included), loads only planned keys
    that were stored, and every loaded byte equals the reader's own."""
    lcm = compute_lcm_span(g)
    for p in sorted({sc.stored[0].prompt for sc in iterate_scenarios(g, rules=rules, evict=False)
                     if len(sc.stored) == 1}):
        for o in (1, 2, lcm + 1):
            for sdc in (False, True):
                try:
                    sc = Scenario(geometry=g, prompt=p + o + g.unit, rules=rules,
                                  stored=(StoredRequest(prompt=p, shared=p + o, decoded=o, save_decode_cache=sdc),))
                except SpecError as err:  # a store rule without decode-phase saves refuses them; nothing else may
                    if err.rule != RULE_DECODED:
                        raise
                    continue
                objs = sorted(memo.outcome(sc).present)
                mid = [attrs.evolve(sc, evicted=frozenset({(*objs[len(objs) // 2], Rank(0))}))] if objs else []
                for one in (sc, *mid):  # whole, and without one shard of the middle object on rank 0
                    out = memo.outcome(one)
                    bad = (*compute_violations(one, out), *compute_plan_violations(one, out))
                    wrong = compute_wrong_positions(one, out)
                    yield Instance(not bad and not wrong, one, f"violations {list(bad)}, {len(wrong)} wrong positions")


def iterate_content(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per scenario of the geometry's scope, whether every loaded byte is what the reader computes itself (it
    reads the whole load, not only h)."""
    for sc in iterate_scenarios(g, rules=rules):
        wrong = compute_wrong_positions(sc, memo.outcome(sc))
        yield Instance(not wrong, sc, f"{len(wrong)} wrong positions (group, position): {list(wrong[:3])}")


def compute_split_parents(rules: RuleSet | str) -> tuple[str, str]:
    """Return (without a drafter, with one): the rule sets a drafter-scoped rule set must equal — its predecessor, and
    the rule set that differs from it only in applying λ everywhere (and in deferred and decode-phase saves, which
    the scope's writers, none of which decoded, never reach)."""
    rs = coerce_rules(rules)
    everywhere = [x for x in RULE_SETS.values() if x.lookahead_scope == LOOKAHEAD_ALWAYS and x.name != rs.name
                  and attrs.evolve(rs, name=x.name, predecessor=x.predecessor, engine=x.engine, deltas=x.deltas,
                                   lookahead_scope=LOOKAHEAD_ALWAYS, deferred_saves=x.deferred_saves,
                                   decode_states=x.decode_states) == x]
    assert rs.predecessor is not None and len(everywhere) == 1, f"{rules} has no drafter split"
    return rs.predecessor, everywhere[0].name


def iterate_split(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per scenario of the geometry's scope, whether a drafter-scoped rule set (vllm-0.34.0) gives exactly
    its predecessor's outcome without an EAGLE-family drafter and its λ-everywhere sibling's with one (the case split
    that carries both families' Z3 theorems over to it). Evaluated afresh, not through the memo: the verdict keys of
    both sides are equal by construction, which is what is being checked."""
    without, with_drafter = compute_split_parents(rules)
    parent = with_drafter if any(x.eagle for x in g.groups) else without
    for sc in iterate_scenarios(g, rules=rules):
        mine, theirs = evaluate_scenario(sc), evaluate_scenario(attrs.evolve(sc, rules=parent))
        same = (mine.present, mine.hit_length, mine.tails, mine.load) == \
               (theirs.present, theirs.hit_length, theirs.tails, theirs.load)
        yield Instance(same, sc, f"{rules}: h {mine.hit_length}, tails {list(mine.tails)}; {parent}: "
                                 f"h {theirs.hit_length}, tails {list(theirs.tails)}")


def iterate_compact(g: Geometry, rules: RuleSet | str, memo: Memo) -> Iterator[Instance]:
    """Yield, per scenario of the geometry's scope, whether the spec answered on runs and points (spec/boundaries.py:
    what scenarios past the explicit limit get) equals the explicit spec: E, h, the tails, the load plan, the error."""
    for sc in iterate_scenarios(g, rules=rules):
        mine, theirs = evaluate_scenario(sc, compact=True), memo.outcome(sc)
        runs = tuple(e for r in mine.load_runs or () for e in r.entries())
        err = (mine.error and mine.error.rule, theirs.error and theirs.error.rule)
        same = (frozenset(mine.present) == theirs.present and mine.hit_length == theirs.hit_length
                and mine.tails == theirs.tails and runs == theirs.load and err[0] == err[1])
        yield Instance(same, sc, f"compact: h {mine.hit_length}, tails {list(mine.tails)}, {len(runs)} blocks; "
                                 f"explicit: h {theirs.hit_length}, tails {list(theirs.tails)}, {len(theirs.load)} blocks")


PROPERTIES: dict[str, tuple[str, Callable[[Geometry, RuleSet | str, Memo], Iterator[Instance]]]] = {
    "BEST": ("h equals the physical best E allows (largest multiple of a below N every group can serve, tail keys up "
             "to ⌊N/u⌋·u); above it would be unsafe", iterate_best),
    "RESEND": ("an identical resend hits ⌊(P−1)/a⌋·a, with EAGLE max(⌊P/a⌋·a − a, 0) (every P ≤ 2L + 2u)",
               iterate_resend),
    "MONO-PREFIX": ("a longer shared prefix never lowers the hit", iterate_mono_prefix),
    "MONO-EVICT": ("evicting one rank's shard of a stored object never raises the hit", iterate_mono_evict),
    "MONO-MORE": ("storing one more request never lowers the hit", iterate_mono_more),
    "FINISHED": ("a writer that decoded (and saved its decode phase or not), read by a lookup continuing its "
                 "conversation: every invariant holds and every loaded byte is the reader's own", iterate_finished),
    "CONTENT": ("every loaded byte equals what the reader computes (attention at p on [0, p], draft at p on "
                "[0, p + 1], Mamba after t on [0, t); spec/content.py)", iterate_content),
    "COMPACT": ("the spec on runs and points (what a scenario past the explicit limit gets: spec/boundaries.py) answers "
                "as the explicit spec: E, h, tails, load plan, error", iterate_compact),
    "SPLIT": ("the rule set's outcome is its predecessor's without an EAGLE-family drafter and its λ-everywhere "
              "sibling's with one (E, h, tails, load plan), so both families' safety theorems hold for it",
              iterate_split),
}
