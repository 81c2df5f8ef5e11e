"""The known bugs of the family, re-introduced as named variants of the spec; each must be caught.

A mutant is a rule set evolved (``attrs.evolve(rule_set, **changes)``): one field of the rule set's data (the
tail-key rule: the loader before #53324, which is also the ``legacy`` rule set's one change) or its steps (a replaced
store, present, lookup, tails, plan, safe or retry step). The scenarios it is hunted on are each rule set's own; the
checks judge its outcome against the spec's E of the unchanged scenario.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Parallel, compute_alignment, compute_group_ids, compute_span, is_fine
from kvspec.spec.invariants import compute_violations
from kvspec.spec.lookup import (
    FINDERS,
    Have,
    LookupResult,
    SpecGroup,
    compute_fixed_point,
    compute_lookup,
    compute_tail_block,
    compute_tail_boundaries,
    find_mamba_hit,
)
from kvspec.spec.plan import LoadEntry, plan_load
from kvspec.spec.rules import STORE_PR53324, TAIL_HIT, TAIL_STORED, RuleSet
from kvspec.spec.scenario import SPEC_STAGES, Scenario, evaluate_scenario
from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule
from kvspec.spec.store import (
    Obj,
    RankObj,
    compute_full_boundary,
    compute_rule_store,
    compute_sub_block_tail,
    is_tail_stored,
)
from kvspec.spec.types import Boundary, GroupId, Tokens


def _descale(g: Geometry) -> Geometry:
    return attrs.evolve(g, parallel=Parallel(dcp=1))


def _no_dcp_lookup(g: Geometry, present: frozenset[Obj], n: Tokens, lookahead: int = 0) -> LookupResult:
    return compute_lookup(_descale(g), present, n, lookahead=lookahead)


def _no_dcp_tails(g: Geometry, present: frozenset[Obj], n: Tokens, h: Tokens, rule: str = TAIL_STORED, lookahead: int = 0) -> Any:
    return compute_tail_boundaries(_descale(g), present, n, h, rule, lookahead)


def _no_dcp_plan(g: Geometry, present: frozenset[Obj], h: Tokens, tails: Any) -> tuple[LoadEntry, ...]:
    return plan_load(_descale(g), present, h, tails)


def _first_attention_floor_plan(g: Geometry, present: frozenset[Obj], h: Tokens, tails: Any) -> tuple[LoadEntry, ...]:
    """Pre-#53324 truncation: only the first attention group is cut, with floor (drops the partial tail block)."""
    full = plan_load(g, present, h, tails)
    first = next((i for i, gr in enumerate(g.groups) if gr.kind == "attention"), None)
    out = []
    for e in full:
        if e.group == first and e.end < (e.block + 1) * compute_span(g, e.group) and e.end == h:
            continue  # floor(h / s) blocks: the partially used tail block is not loaded
        out.append(e)
    # the other attention groups are left at their own (untruncated) length: one block further when it exists
    for gid, gr in enumerate(g.groups):
        if gr.kind == "attention" and gid != first and h > 0:
            s = compute_span(g, GroupId(gid))
            nxt = compute_tail_block(s, h) + 1
            if (GroupId(gid), Boundary((nxt + 1) * s)) in present:
                out.append(LoadEntry(group=GroupId(gid), block=nxt, start=Tokens(nxt * s), end=Tokens((nxt + 1) * s),
                                     key_boundary=Boundary((nxt + 1) * s), present=True))
    return tuple(sorted(out, key=lambda e: (e.group, e.block)))


def _drop_on_load_plan(g: Geometry, present: frozenset[Obj], h: Tokens, tails: Any) -> tuple[LoadEntry, ...]:
    """The EAGLE drop applied again on the load side: the load covers h minus one alignment unit."""
    if not any(gr.eagle for gr in g.groups) or h <= 0:
        return plan_load(g, present, h, tails)
    a = compute_alignment(g)
    h2 = Tokens(max(h - a, 0) // a * a)
    return plan_load(g, present, h2, compute_tail_boundaries(g, present, Tokens(h), h2) if h2 > 0 else ())


def _mamba_margin_finder(g: Geometry, sg: SpecGroup, have: Have, cur: Tokens, max_len: Tokens,
                         drop: bool) -> tuple[Tokens, Tokens]:
    """#43559: Mamba searched past the candidate with the EAGLE peek margin."""
    if not any(gr.eagle for gr in g.groups):
        return cur, find_mamba_hit(g, sg.block_size, have, cur)
    search = Tokens(min(cur + (g.unit if is_fine(g) else sg.block_size), max_len))
    return search, find_mamba_hit(g, sg.block_size, have, search)


MAMBA_MARGIN_FINDERS: Mapping[str, Any] = {**FINDERS, "mamba": _mamba_margin_finder}


def _mamba_margin_lookup(g: Geometry, present: frozenset[Obj], n: Tokens, lookahead: int = 0) -> LookupResult:
    return compute_lookup(g, present, n, finders=MAMBA_MARGIN_FINDERS, lookahead=lookahead)


def _rank0_present(g: Geometry, objects: frozenset[Obj], evicted: Iterable[RankObj]) -> frozenset[Obj]:
    """#46855: the lookup checks only rank 0's keys."""
    return objects - {(gid, t) for gid, t, r in evicted if r == 0}


def _no_rederive_lookup(g: Geometry, present: frozenset[Obj], n: Tokens, lookahead: int = 0) -> LookupResult:
    """#43494/#49481: a full-prompt hit is not re-derived below N."""
    a = compute_alignment(g)
    bound = Tokens(max(n - lookahead, 0) // a * a)
    if bound <= 0:
        return LookupResult(hit_length=Tokens(0), bound=bound, rederived=False, trace=())
    hit, steps = compute_fixed_point(g, present, bound)
    return LookupResult(hit_length=hit, bound=bound, rederived=False, trace=steps)


def _tails_picking(g: Geometry, present: frozenset[Obj], h: Tokens, pick: Any) -> Any:
    """Return (g, B_g): h when stored, else pick(group, span) among the group's stored boundaries (a mutant's rule)."""
    if h <= 0:
        return ()
    out = []
    for gid in range(len(g.groups)):
        if (GroupId(gid), Boundary(h)) in present:
            out.append((GroupId(gid), Boundary(h)))
            continue
        found = pick(gid, compute_span(g, GroupId(gid)))
        if found is None:
            raise SpecError("tail-key-missing", f"no stored tail key for group {gid} at hit length {h}")
        out.append((GroupId(gid), Boundary(found)))
    return tuple(out)


def _backward_tails(g: Geometry, present: frozenset[Obj], n: Tokens, h: Tokens, rule: str = TAIL_STORED, lookahead: int = 0) -> Any:
    """The tail scan going backwards from h inside the block instead of forwards."""
    def pick(gid: int, s: Tokens) -> int | None:
        lo = compute_tail_block(s, h) * s
        return max((t for x, t in present if x == gid and lo < t < h and t % g.unit == 0), default=None)

    return _tails_picking(g, present, h, pick)


def _double_drop_finder(g: Geometry, sg: SpecGroup, have: Have, cur: Tokens, max_len: Tokens,
                        drop: bool) -> tuple[Tokens, Tokens]:
    """The EAGLE drop taken twice: safe (a shorter hit), but not the best hit E allows."""
    search, hit = FINDERS["attention"](g, sg, have, cur, max_len, drop)
    a = compute_alignment(g)
    return search, Tokens(max(hit - a, 0) if drop else hit)


def _double_drop_lookup(g: Geometry, present: frozenset[Obj], n: Tokens, lookahead: int = 0) -> LookupResult:
    return compute_lookup(g, present, n, finders={**FINDERS, "attention": _double_drop_finder}, lookahead=lookahead)


def _largest_tails(g: Geometry, present: frozenset[Obj], n: Tokens, h: Tokens, rule: str = TAIL_STORED,
                   lookahead: int = 0) -> Any:
    """The tail key taken at the largest stored boundary of h's block: stored and in the block, but not the smallest."""
    def pick(gid: int, s: Tokens) -> int | None:
        top = min((compute_tail_block(s, h) + 1) * s, max(n - lookahead, 0) // g.unit * g.unit)
        return max((t for x, t in present if x == gid and h < t <= top and t % g.unit == 0), default=None)

    return _tails_picking(g, present, h, pick)


def _safe_zero(g: Geometry, present: frozenset[Obj], h: Tokens, plan: Any, ok: Any) -> Tokens:
    return h if all(ok) else Tokens(0)  # any failure discards the whole hit: safe, but not the largest


def _tail_any_mamba_store(rules: RuleSet, g: Geometry, p: Tokens, schedule: Schedule = BLOCK_SCHEDULE) -> frozenset[Obj]:
    """The PR's store rule with its tail condition inverted: the partial tail dropped whenever T is a multiple of *any*
    Mamba block size (the PR stores it unless T is a multiple of every one). Safe: it only stores less."""
    out = compute_rule_store(rules, g, p, schedule)
    t, mamba = compute_sub_block_tail(g, p), compute_group_ids(g, "mamba")
    if rules.store != STORE_PR53324 or not is_tail_stored(g, p) or all(t % g.groups[m].block_size for m in mamba):
        return out
    full = compute_full_boundary(g, p)
    return frozenset((gid, x) for gid, x in out if not (
        (g.groups[gid].kind == "attention" and x > full) or (g.groups[gid].kind == "mamba" and int(x) == int(t)
                                                             and t % g.groups[gid].block_size)))


@attrs.frozen(kw_only=True)
class Mutant:
    """A known bug as a variant of a rule set: `changes` are the fields evolved (`stages`: the steps replaced, as
    attrs.evolve(SPEC_STAGES, step=...)); `closure` ones are hunted over partly failed loads. A store rule that only
    stores less is safe: hunted, MAX-HIT sees it only because it judges against the spec's own E; were the spec's
    store rule written that way, that E would shrink with it and only the cache-efficiency rows would notice — so such
    a mutant's row runs those (`efficiency`: their properties; each of their rows in checks/rulesets.py, run under the
    mutant's rule sets, must keep its measured result)."""

    name: str
    bug: str
    changes: Mapping[str, Any] = attrs.field(eq=False, hash=False)
    closure: bool = False
    efficiency: tuple[str, ...] = ()

    def vary(self, rules: RuleSet) -> RuleSet:
        """Return the rule set with the mutant's changes (attrs.evolve(rules, **changes))."""
        return attrs.evolve(rules, **self.changes)

    def vary_scenario(self, scenario: Scenario) -> Scenario:
        """Return the scenario under the mutant: its rule set and every stored request's own (a mixed fleet's)
        evolved."""
        return attrs.evolve(scenario, rules=self.vary(scenario.rules), stored=tuple(
            r if r.rules is None else attrs.evolve(r, rules=self.vary(r.rules)) for r in scenario.stored))


def _keeps_hit(g: Geometry, present: frozenset[Obj], h: Tokens, plan: Any, ok: Any) -> Tokens:
    return h  # a failed block still counted: no closure


def _retry_same_hit(failed_loads: int, safe: Tokens) -> Tokens | None:
    return None  # no cap: the failing hit is offered again


def _steps(**steps: Any) -> dict[str, Any]:
    """Return the changes of a mutant that replaces steps of the spec (the rule set's `stages`)."""
    return {"stages": attrs.evolve(SPEC_STAGES, **steps)}


MUTANTS: tuple[Mutant, ...] = (
    Mutant(name="legacy-tail-key", bug="#53324: tail block keyed at the hit length",
           changes={"tail_key": TAIL_HIT}),
    Mutant(name="no-dcp-scaling", bug="before #53324: hybrid lookup/load with unscaled attention spans",
           changes=_steps(lookup=_no_dcp_lookup, tails=_no_dcp_tails, plan=_no_dcp_plan)),
    Mutant(name="first-attention-floor", bug="before #53324: only the first attention group truncated, with floor",
           changes=_steps(plan=_first_attention_floor_plan)),
    Mutant(name="eagle-drop-on-load", bug="EAGLE drop applied again on the load side (apply_eagle=True)",
           changes=_steps(plan=_drop_on_load_plan)),
    Mutant(name="mamba-peek-margin", bug="#43559: a peek margin for Mamba",
           changes=_steps(lookup=_mamba_margin_lookup)),
    Mutant(name="rank0-only-lookup", bug="#46855: lookup checks only rank 0's keys",
           changes=_steps(present=_rank0_present)),
    Mutant(name="no-rederive-below-n", bug="#43494/#49481: full-prompt hit not re-derived below N",
           changes=_steps(lookup=_no_rederive_lookup)),
    Mutant(name="tail-scan-backward", bug="the tail scan going backwards instead of forwards",
           changes=_steps(tails=_backward_tails)),
    Mutant(name="eagle-drop-twice", bug="the EAGLE drop taken twice: a shorter hit than E allows (safe, not best)",
           changes=_steps(lookup=_double_drop_lookup)),
    Mutant(name="tail-scan-largest", bug="the tail key at the largest stored boundary of h's block (safe, not smallest)",
           changes=_steps(tails=_largest_tails)),
    Mutant(name="closure-keeps-hit", bug="#53730/#48216: a failed block still counted (no closure)",
           changes=_steps(safe=_keeps_hit), closure=True),
    Mutant(name="closure-retry-same-hit", bug="#55297: the failing hit offered again (no retry cap)",
           changes=_steps(retry=_retry_same_hit), closure=True),
    Mutant(name="closure-safe-zero", bug="any failed block discards the whole hit (safe, but not the largest boundary)",
           changes=_steps(safe=_safe_zero), closure=True),
    Mutant(name="store-tail-any-mamba", bug="the sub-block tail dropped when T is a multiple of any Mamba block size "
                                            "(the PR: of every one); safe, stores less",
           changes=_steps(store=_tail_any_mamba_store), efficiency=("RESEND",)),
)


def compute_mutant_violations(mutant: Mutant, scenario: Scenario) -> tuple[str, ...]:
    """Return the checks a mutant's outcome on one scenario violates, judged on the unchanged scenario (a spec error
    counts as I-18)."""
    out = evaluate_scenario(mutant.vary_scenario(scenario))
    bad = compute_violations(scenario, out)
    return bad + (("I-18",) if out.error is not None and "I-18" not in bad else ())


def hunt(mutant: Mutant, scenarios: Iterable[Scenario]) -> tuple[tuple[str, ...], Scenario | None, int]:
    """Return (checks that caught it, the first catching scenario, scenarios tried) over a scenario stream."""
    n = 0
    for sc in scenarios:
        n += 1
        bad = compute_mutant_violations(mutant, sc)
        if bad:
            return bad, sc, n
    return (), None, n
