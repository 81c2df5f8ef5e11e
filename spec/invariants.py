"""The invariant registry: each invariant is one named predicate over the ops shim.

Two kinds of predicate:

* ``arith`` — over integer variables with an explicit precondition ``pre``; Z3 proves
  ``pre => claim`` for all integers, Hypothesis and exhaustive runs evaluate it on ints.
* ``scenario`` — over a :class:`Witness` (the observable quantities of one lookup: h, the
  bound, each group's span, tail block, tail boundary, tail load key and membership in E).
  On ints the witness comes from the executable spec (:func:`compute_witness`); for Z3 it is
  built from the closed form of the attention + Mamba lookup (``checks/verify/closed_form.py``).
* ``maximal`` — over the same witness: the best, not only the safe (h is the best hit E allows,
  each tail boundary the smallest); checked exhaustively (``make verify``'s EXHAUSTIVE rows).
* ``failure`` — over a :class:`FailureWitness` of a partly failed load (F-1..F-7, F-MAX);
  checked exhaustively.

Ids follow ``docs/domain.md`` section 6 (I-n) where one exists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs

from .content import KIND_ATTENTION, KIND_MAMBA, compute_dependency_end_of
from .failure import compute_loaded_prefix
from .geometry import Geometry, compute_alignment, compute_group_ids, compute_span
from .lookup import ObjSet, compute_best_hit, compute_group_present, compute_lookup, compute_tail_block
from .ops import IntOps
from .rules import compute_lookahead, compute_rule_geometry
from .scenario import Outcome, Scenario, compute_scenario_present, compute_stages
from .types import GroupId, Tokens

MISSING = -1  # tail boundary of a group whose tail key could not be found


@attrs.frozen(kw_only=True)
class GroupView:
    """What one group contributes to a witness; values are ints or Z3 terms."""

    attention: bool
    span: Any
    tail_block: Any  # c = ceil(h/s) - 1
    tail: Any  # B_g, or MISSING
    tail_key: Any  # the key boundary the load uses for block c (B_g; h under the legacy rule)
    has: Callable[[Any], Any]  # t -> whether (g, t) is in E


@attrs.frozen(kw_only=True)
class Witness:
    """The observables of one lookup, for scenario invariants."""

    unit: Any
    alignment: Any
    prompt: Any  # N
    shared: Any  # longest prefix shared with any stored request
    bound: Any  # ⌊N/a⌋·a
    hit: Any  # h
    groups: tuple[GroupView, ...]
    best: Any = None  # the best hit the rules allow given E (lookup.compute_best_hit; the maximal invariants only)


def compute_witness(scenario: Scenario, outcome: Outcome) -> Witness:
    """Return the int witness of an evaluated scenario, judged against the spec's own E."""
    g = scenario.geometry
    h = outcome.hit_length
    # outcome.present is not trusted (a mutant may have computed it): E comes from the spec's own rules
    truth = compute_scenario_present(scenario)
    tails = dict(outcome.tails)
    last_key = {e.group: e.key_boundary for e in outcome.load}  # plan order: last entry of g is its tail block
    views = []
    for gid, gr in enumerate(g.groups):
        s = compute_span(g, GroupId(gid))
        mine = compute_group_present(truth, (GroupId(gid),))
        views.append(GroupView(attention=gr.kind == "attention", span=s,
                               tail_block=compute_tail_block(s, h) if h > 0 else -1,
                               tail=tails.get(GroupId(gid), MISSING), tail_key=last_key.get(GroupId(gid), MISSING),
                               has=mine.__contains__))
    a = compute_alignment(g)
    rules = scenario.rules
    best = compute_best_hit(compute_rule_geometry(rules, g), truth, Tokens(scenario.prompt),
                            compute_lookahead(rules, g))
    return Witness(unit=g.unit, alignment=a, prompt=scenario.prompt, shared=compute_shared(scenario),
                   bound=scenario.prompt // a * a, hit=h, groups=tuple(views), best=best)


def compute_shared(scenario: Scenario) -> int:
    """Return the longest prefix the lookup shares with a stored request (N itself for an explicit E)."""
    return scenario.prompt if scenario.objects is not None else max((r.shared for r in scenario.stored), default=0)


# ---------------------------------------------------------------- scenario predicates

def inv_hit_aligned_below_prompt(ops: Any, w: Witness) -> Any:
    """Return whether h is a multiple of a with 0 <= h <= ⌊N/a⌋·a and h < N (I-12)."""
    return ops.And(ops.divides(w.alignment, w.hit), w.hit >= 0, w.hit <= w.bound, w.hit < w.prompt)


def inv_hit_within_shared(ops: Any, w: Witness) -> Any:
    """Return whether h never exceeds the prefix the lookup shares with a stored request."""
    return w.hit <= w.shared


def inv_mamba_at_hit(ops: Any, w: Witness) -> Any:
    """Return whether every Mamba group has its state stored at exactly h when h > 0 (I-14)."""
    return ops.And(True, *(ops.Implies(w.hit > 0, g.has(w.hit)) for g in w.groups if not g.attention))


def inv_attention_full_blocks(ops: Any, w: Witness) -> Any:
    """Return whether every attention block before the tail block is present under its full-block key (I-15)."""
    return ops.And(True, *(ops.Implies(w.hit > 0, ops.all_below(g.tail_block, lambda i, g=g: g.has((i + 1) * g.span)))
                           for g in w.groups if g.attention))


def inv_tail_exists(ops: Any, w: Witness) -> Any:
    """Return whether every group has a tail boundary when h > 0 (I-18: 'no tail key' is unreachable)."""
    return ops.And(True, *(ops.Implies(w.hit > 0, g.tail != MISSING) for g in w.groups))


def inv_tail_properties(ops: Any, w: Witness) -> Any:
    """Return whether each B_g is a stored unit multiple in h's block, within ⌊N/u⌋·u, and = h for Mamba (I-19)."""
    parts = []
    for g in w.groups:
        ok = ops.And(w.hit <= g.tail, g.tail <= (g.tail_block + 1) * g.span, ops.divides(w.unit, g.tail),
                     ops.cdiv(g.tail, g.span) - 1 == g.tail_block, g.has(g.tail),
                     g.tail <= ops.floordiv(w.prompt, w.unit) * w.unit,
                     True if g.attention else g.tail == w.hit)
        parts.append(ops.Implies(w.hit > 0, ok))
    return ops.And(True, *parts)


def inv_load_keys_stored(ops: Any, w: Witness) -> Any:
    """Return whether every load key is a stored key: full blocks at (i+1)·s, the tail block at its load key (I-20)."""
    parts = []
    for g in w.groups:
        full = ops.all_below(g.tail_block, lambda i, g=g: g.has((i + 1) * g.span)) if g.attention else True
        parts.append(ops.Implies(w.hit > 0, ops.And(full, g.has(g.tail_key))))
    return ops.And(True, *parts)


def inv_tail_key_in_tail_block(ops: Any, w: Witness) -> Any:
    """Return whether each tail load key lies in the block of token h-1 and covers [0, h) (I-19/I-22)."""
    return ops.And(True, *(ops.Implies(w.hit > 0, ops.And(w.hit <= g.tail_key,
                                                           g.tail_key <= (g.tail_block + 1) * g.span))
                           for g in w.groups))


# ---------------------------------------------------------------- arithmetic predicates

def pre_spans(ops: Any, u: Any, ba: Any, bm: Any, d: Any, lcm: Any) -> Any:
    """Return the precondition: u | b_a, u | b_m, D >= 1, L a positive common multiple of both spans."""
    return ops.And(u >= 1, ba >= 1, bm >= 1, d >= 1, ops.divides(u, ba), ops.divides(u, bm), lcm >= 1,
                   ops.divides(ba * d, lcm), ops.divides(bm, lcm))


def inv_spans_aligned(ops: Any, u: Any, ba: Any, bm: Any, d: Any, lcm: Any) -> Any:
    """Return whether u divides both spans and L, and each span divides L (I-1, I-2)."""
    sa, sm = ba * d, bm
    return ops.And(ops.divides(u, sa), ops.divides(u, sm), ops.divides(u, lcm), ops.divides(sa, lcm),
                   ops.divides(sm, lcm), sa == ba * d, sm == bm)


def pre_ownership(ops: Any, d: Any, il: Any, b: Any, o1: Any, o2: Any) -> Any:
    """Return the precondition: D, I, b >= 1, I | b, two offsets inside one block of span b·D."""
    s = b * d
    return ops.And(d >= 1, il >= 1, b >= 1, ops.divides(il, b), o1 >= 0, o1 < s, o2 >= 0, o2 < s)


def _owner(ops: Any, o: Any, d: Any, il: Any) -> tuple[Any, Any]:
    return (ops.mod(ops.floordiv(o, il), d),
            ops.floordiv(o, d * il) * il + ops.mod(o, il))


def inv_ownership_bijection(ops: Any, d: Any, il: Any, b: Any, o1: Any, o2: Any) -> Any:
    """Return whether (rank, slot) is in range and distinct offsets get distinct pairs (a bijection, I-4)."""
    r1, s1 = _owner(ops, o1, d, il)
    r2, s2 = _owner(ops, o2, d, il)
    return ops.And(r1 >= 0, r1 < d, s1 >= 0, s1 < b, ops.Implies(ops.And(r1 == r2, s1 == s2), o1 == o2))


def inv_ownership_prefix(ops: Any, d: Any, il: Any, b: Any, o1: Any, o2: Any) -> Any:
    """Return whether slots grow with the offset on each rank, so a block prefix is a slot prefix on every rank."""
    r1, s1 = _owner(ops, o1, d, il)
    r2, s2 = _owner(ops, o2, d, il)
    return ops.Implies(ops.And(r1 == r2, o1 < o2), s1 < s2)


def pre_store_key(ops: Any, u: Any, s: Any, tail: Any, i: Any) -> Any:
    """Return the precondition: u | s, u | T, T >= 1, block i between 0 and ⌈T/s⌉ - 1."""
    return ops.And(u >= 1, s >= 1, ops.divides(u, s), tail >= 1, ops.divides(u, tail), i >= 0,
                   i <= ops.cdiv(tail, s) - 1)


def inv_store_key_in_block(ops: Any, u: Any, s: Any, tail: Any, i: Any) -> Any:
    """Return whether t = min((i+1)s, T) lies in block i (i·s < t <= (i+1)·s) and is a multiple of u (I-6)."""
    t = ops.min((i + 1) * s, tail)
    return ops.And(i * s < t, t <= (i + 1) * s, ops.divides(u, t), ops.cdiv(t, s) - 1 == i)


def pre_loaded_from_visible(ops: Any, lam: Any, reach: Any, kind: Any, t: Any, p: Any, s: Any) -> Any:
    """Return the precondition: key t >= 1 visible from a writer sharing s (t + λ <= s), KV at p < t or state at t."""
    # kind 0 attention, 1 draft KV (a drafter reaching L >= 1 tokens past p), 2 the Mamba state after t tokens
    return ops.And(lam >= 0, reach >= 1, t >= 1, t + lam <= s, kind >= KIND_ATTENTION, kind <= KIND_MAMBA,
                   ops.If(kind == KIND_MAMBA, p == t, ops.And(p >= 0, p < t)))


def pre_content_key(ops: Any, lam: Any, reach: Any, kind: Any, t: Any, p: Any, s: Any) -> Any:
    """Return the precondition: key t visible (t + λ <= s), KV at p < t or state at t; lookahead λ >= the reach L."""
    return ops.And(pre_loaded_from_visible(ops, lam, reach, kind, t, p, s), lam >= reach)


def inv_loaded_byte_shared(ops: Any, lam: Any, reach: Any, kind: Any, t: Any, p: Any, s: Any) -> Any:
    """Return whether the byte depends only on tokens the reader shares with its writer: its dependency end <= s."""
    return compute_dependency_end_of(ops, kind, p, reach) <= s


# ---------------------------------------------------------------- failure closure

@attrs.frozen(kw_only=True)
class FailureWitness:
    """The observables of a partly failed load: h, the safe boundary, what loaded, the capped retry's hit."""

    alignment: Any
    hit: Any
    safe: Any
    all_ok: Any
    attention_loaded: tuple[Any, ...]  # per attention group: end of its leading run of loaded blocks
    mamba_has: Callable[[Any], Any]  # t -> every Mamba group has a stored state at t
    mamba_loaded: Any  # every Mamba block of the plan loaded
    has_mamba: bool
    retry_hit: Any  # the next lookup's hit, capped by the retry rule


def inv_safe_bounds(ops: Any, w: FailureWitness) -> Any:
    """Return whether 0 <= safe <= h and safe is a multiple of a (F-1)."""
    return ops.And(w.safe >= 0, w.safe <= w.hit, ops.divides(w.alignment, w.safe))


def inv_safe_nothing_lost(ops: Any, w: FailureWitness) -> Any:
    """Return whether a load with no failure keeps the whole hit (F-2)."""
    return ops.Implies(w.all_ok, w.safe == w.hit)


def inv_safe_attention_loaded(ops: Any, w: FailureWitness) -> Any:
    """Return whether every attention group has [0, safe) loaded (F-3)."""
    return ops.And(True, *(w.safe <= x for x in w.attention_loaded))


def inv_safe_mamba_state(ops: Any, w: FailureWitness) -> Any:
    """Return whether every Mamba group has a state at exactly the safe boundary: loaded when safe = h (F-4)."""
    if not w.has_mamba:
        return True
    return ops.And(ops.Implies(w.safe > 0, w.mamba_has(w.safe)),
                   ops.Implies(ops.And(w.safe > 0, w.safe == w.hit), w.mamba_loaded))


def inv_retry_progress(ops: Any, w: FailureWitness) -> Any:
    """Return whether a failed load is never offered the same failing hit again: the retry stays <= safe (F-7)."""
    return ops.Implies(ops.Not(w.all_ok), ops.And(w.retry_hit <= w.safe, ops.Or(w.safe == w.hit, w.retry_hit < w.hit)))


# ---------------------------------------------------------------- maximality: the best, not only the safe

def inv_hit_is_best(ops: Any, w: Witness) -> Any:
    """Return whether h is the best hit the rules allow given E (MAX-HIT): no larger boundary could be served."""
    return w.hit == w.best


def inv_tail_is_smallest(ops: Any, w: Witness) -> Any:
    """Return whether each B_g is the smallest stored unit boundary >= h: none in (h, B_g) (MAX-TAIL)."""
    return ops.And(True, *(ops.Or(g.tail == MISSING, ops.all_below(
        ops.floordiv(g.tail - w.hit, w.unit) - 1, lambda i, g=g: ops.Not(g.has(w.hit + (i + 1) * w.unit))))
        for g in w.groups))


def inv_safe_is_largest(ops: Any, w: FailureWitness) -> Any:
    """Return whether no boundary in (safe, h] (multiple of a) has every attention prefix loaded and every Mamba
    state usable: the safe boundary is the largest (F-MAX)."""
    def usable(b: Any) -> Any:
        mamba = ops.If(b == w.hit, w.mamba_loaded, w.mamba_has(b)) if w.has_mamba else True
        return ops.And(mamba, *(b <= x for x in w.attention_loaded))

    return ops.all_below(ops.floordiv(w.hit - w.safe, w.alignment),
                         lambda i: ops.Not(usable(w.safe + (i + 1) * w.alignment)))


@attrs.frozen(kw_only=True)
class Invariant:
    """A registered invariant: stable id, claim, predicate and how it is checked."""

    id: str
    statement: str
    kind: str  # "scenario" | "arith" | "failure" | "maximal" (scenario witnesses, checked exhaustively)
    predicate: Callable[..., Any]
    pre: Callable[..., Any] | None = None
    variables: tuple[str, ...] = ()
    reads_shared: bool = False  # a scenario predicate reading the witness's shared prefix (outside the verdict key)


REGISTRY: tuple[Invariant, ...] = (
    Invariant(id="I-1/2", statement="u | s_g, s_g | L; attention span = b·D, Mamba span = b",
              kind="arith", predicate=inv_spans_aligned, pre=pre_spans, variables=("u", "ba", "bm", "d", "lcm")),
    Invariant(id="I-4", statement="DCP ownership is a bijection tokens of a block <-> (rank, slot), any I | b",
              kind="arith", predicate=inv_ownership_bijection, pre=pre_ownership,
              variables=("d", "il", "b", "o1", "o2")),
    Invariant(id="I-4p", statement="a block prefix [i·s, h) covers a prefix of the slots on every rank",
              kind="arith", predicate=inv_ownership_prefix, pre=pre_ownership, variables=("d", "il", "b", "o1", "o2")),
    Invariant(id="CONTENT-KEY", statement="a byte loaded under a key its writer made visible (t + λ <= S) depends only "
              "on tokens the reader shares with that writer — attention at p < t on [0, p], draft on [0, p + L], Mamba "
              "at t on [0, t) — when λ >= the drafter's reach L", kind="arith", predicate=inv_loaded_byte_shared,
              pre=pre_content_key, variables=("lam", "reach", "kind", "t", "p", "s")),
    Invariant(id="I-6", statement="a stored boundary t = min((i+1)s, T) lies in its block and is a multiple of u",
              kind="arith", predicate=inv_store_key_in_block, pre=pre_store_key, variables=("u", "s", "tail", "i")),
    Invariant(id="I-12", statement="h is a multiple of a, 0 <= h <= ⌊N/a⌋·a and h < N",
              kind="scenario", predicate=inv_hit_aligned_below_prompt),
    Invariant(id="I-SHARED", statement="h <= the prefix shared with a stored request",
              kind="scenario", predicate=inv_hit_within_shared, reads_shared=True),
    Invariant(id="I-14", statement="h > 0 => every Mamba group's state at h is stored",
              kind="scenario", predicate=inv_mamba_at_hit),
    Invariant(id="I-15", statement="h > 0 => every attention block before the tail block is stored at (i+1)·s",
              kind="scenario", predicate=inv_attention_full_blocks),
    Invariant(id="I-18", statement="h > 0 => every group has a tail boundary ('no tail key' is unreachable)",
              kind="scenario", predicate=inv_tail_exists),
    Invariant(id="I-19", statement="B_g: stored, multiple of u, in the block of token h-1, <= ⌊N/u⌋·u, = h for Mamba",
              kind="scenario", predicate=inv_tail_properties),
    Invariant(id="I-20", statement="every load key is a stored key (tail from the stored boundary, not from h)",
              kind="scenario", predicate=inv_load_keys_stored),
    Invariant(id="I-22", statement="each tail load key covers [0, h) and lies in the block of token h-1",
              kind="scenario", predicate=inv_tail_key_in_tail_block),
    Invariant(id="MAX-HIT", statement="h is the best hit given E: the largest multiple of a below N with every Mamba "
              "state at h and every attention group able to serve h (h + min(a, s) for EAGLE); brute force",
              kind="maximal", predicate=inv_hit_is_best),
    Invariant(id="MAX-TAIL", statement="each B_g is the smallest stored unit boundary >= h (none in (h, B_g))",
              kind="maximal", predicate=inv_tail_is_smallest),
    Invariant(id="F-1", statement="the safe boundary is a multiple of a within [0, h]", kind="failure",
              predicate=inv_safe_bounds),
    Invariant(id="F-2", statement="a load without failure keeps the whole hit", kind="failure",
              predicate=inv_safe_nothing_lost),
    Invariant(id="F-3", statement="every attention group has [0, safe) loaded", kind="failure",
              predicate=inv_safe_attention_loaded),
    Invariant(id="F-4", statement="every Mamba group has a state at exactly safe (the loaded one when safe = h)",
              kind="failure", predicate=inv_safe_mamba_state),
    Invariant(id="F-7", statement="a failed load is retried at most at the safe boundary, never the same failing hit",
              kind="failure", predicate=inv_retry_progress),
    Invariant(id="F-MAX", statement="the safe boundary is the largest: no b in (safe, h] has every group's needs met",
              kind="failure", predicate=inv_safe_is_largest),
)


def get_invariant(inv_id: str) -> Invariant:
    """Return the registered invariant with this id."""
    for inv in REGISTRY:
        if inv.id == inv_id:
            return inv
    raise KeyError(inv_id)


# the scenario and maximal predicates judged once per verdict key, and those judged per scenario (the shared prefix)
_KEYED = tuple((inv.id, inv.predicate) for inv in REGISTRY if inv.kind in ("scenario", "maximal") and not inv.reads_shared)
_SHARED = tuple((inv.id, inv.predicate) for inv in REGISTRY if inv.reads_shared)
_FAILURE = tuple((inv.id, inv.predicate) for inv in REGISTRY if inv.kind == "failure")


def compute_keyed_violations(scenario: Scenario, outcome: Outcome) -> tuple[Witness, tuple[str, ...]]:
    """Return (the witness, the ids of the invariants it violates that do not read the shared prefix, and I-21)."""
    w = compute_witness(scenario, outcome)
    bad = tuple(inv_id for inv_id, predicate in _KEYED if not predicate(IntOps, w))
    return w, bad + compute_plan_violations(scenario, outcome)


def compute_shared_violations(witness: Witness, shared: int) -> tuple[str, ...]:
    """Return the ids of the invariants reading the shared prefix that the witness violates with that prefix."""
    w = witness if witness.shared == shared else attrs.evolve(witness, shared=shared)
    return tuple(inv_id for inv_id, predicate in _SHARED if not predicate(IntOps, w))


def compute_violations(scenario: Scenario, outcome: Outcome) -> tuple[str, ...]:
    """Return the ids of the scenario invariants (and structural rules) an evaluated scenario violates: those of
    compute_keyed_violations, then those reading the shared prefix."""
    w, bad = compute_keyed_violations(scenario, outcome)
    return bad + compute_shared_violations(w, compute_shared(scenario))


def compute_verdict_key(scenario: Scenario) -> tuple[Any, ...]:
    """Return (geometry, rule geometry, tail rule, λ, the replaced steps, E after evictions, N)."""
    # all that evaluate_scenario, compute_keyed_violations and compute_failure_violations read
    # of a scenario: scenarios with equal keys get equal verdicts (tests/test_spec_invariants.py); the shared prefix
    # is not in it, the invariants that read it (reads_shared) are judged per scenario
    rules = scenario.rules
    return (scenario.geometry, compute_rule_geometry(rules, scenario.geometry), rules.tail_key,
            compute_lookahead(rules, scenario.geometry), rules.stages,
            compute_scenario_present(scenario), scenario.prompt)


def compute_plan_violations(scenario: Scenario, outcome: Outcome) -> tuple[str, ...]:
    """Return ['I-21'] unless the plan loads attention blocks 0..c and Mamba block c, each [i·s, min((i+1)s, h))."""
    g, h = scenario.geometry, outcome.hit_length
    if outcome.error is not None:
        return ("I-21",)
    want = []
    if h > 0:
        for gid, gr in enumerate(g.groups):
            s = compute_span(g, GroupId(gid))
            c = compute_tail_block(s, h)
            for i in (range(c + 1) if gr.kind == "attention" else (c,)):
                want.append((gid, i, i * s, min((i + 1) * s, h)))
    got = [(e.group, e.block, e.start, e.end) for e in outcome.load]
    return () if got == want else ("I-21",)


def compute_failure_witness(scenario: Scenario, outcome: Outcome, ok: tuple[bool, ...]) -> FailureWitness:
    """Return the failure witness of a load whose per-block results are `ok` (the rule set's closure steps)."""
    rules = scenario.rules
    stages = compute_stages(rules)
    g, h, present = compute_rule_geometry(rules, scenario.geometry), outcome.hit_length, outcome.present
    safe = stages.safe(g, present, h, outcome.load, ok)
    mambas = compute_group_ids(g, "mamba")
    all_ok = all(ok)
    cap = stages.retry(0 if all_ok else 1, safe)
    retry = (compute_retry_hit(g, present, Tokens(scenario.prompt), cap, compute_lookahead(rules, scenario.geometry))
             if cap is not None else h)  # the rule set's own lookup, capped
    return FailureWitness(
        alignment=compute_alignment(g), hit=h, safe=safe, all_ok=all_ok,
        attention_loaded=tuple(compute_loaded_prefix(g, a, h, outcome.load, ok)
                               for a in compute_group_ids(g, "attention")),
        mamba_has=compute_group_present(present, mambas).__contains__ if mambas else lambda t: True,
        mamba_loaded=all(good for e, good in zip(outcome.load, ok) if e.group in mambas),
        has_mamba=bool(mambas), retry_hit=retry)


@functools.lru_cache(maxsize=256)  # the load results of one scenario mostly share their cap
def compute_retry_hit(geometry: Geometry, present: ObjSet, prompt: Tokens, cap: Tokens, lookahead: int) -> Tokens:
    """Return the hit of the spec's own lookup of N tokens capped at `cap` (the retry after a failed load)."""
    return compute_lookup(geometry, present, prompt, cap=cap, lookahead=lookahead).hit_length


def compute_failure_violations(scenario: Scenario, outcome: Outcome, ok: tuple[bool, ...]) -> tuple[str, ...]:
    """Return the ids of the failure-closure invariants a load result violates."""
    w = compute_failure_witness(scenario, outcome, ok)
    return tuple(inv_id for inv_id, predicate in _FAILURE if not predicate(IntOps, w))
