"""Lookup: per-group finders, the hybrid fixed point, the N-1 re-derivation and tail boundaries.

E is the set of present (group, boundary) objects in the lookup request's own hash chain.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import cast

import attrs

from .boundaries import (
    Boundaries,
    Objects,
    compute_group_boundaries,
    compute_intersection,
    compute_whole_run,
    find_max,
    find_min,
    has_boundary,
)
from .errors import SpecError
from .geometry import Geometry, compute_alignment, compute_span, is_eagle_spec, is_fine
from .rules import TAIL_HIT, TAIL_STORED
from .store import Obj
from .types import Boundary, GroupId, Tokens

ObjSet = frozenset[Obj] | Objects  # E: listed, or held per group as runs and points (spec/boundaries.py)
Have = frozenset[Boundary] | Boundaries  # one spec group's present boundaries, in either form


def find_largest_in(have: Have, lo: int, hi: int, mod: int = 1) -> int | None:
    """Return max{t ∈ have : lo < t <= hi, mod | t}, None when there is none."""
    if isinstance(have, Boundaries):
        return find_max(have, lo, hi, mod)
    return max((t for t in have if lo < t <= hi and t % mod == 0), default=None)


def find_smallest_in(have: Have, lo: int, hi: int, mod: int = 1) -> int | None:
    """Return min{t ∈ have : lo < t <= hi, mod | t}, None when there is none."""
    if isinstance(have, Boundaries):
        return find_min(have, lo, hi, mod)
    return min((t for t in have if lo < t <= hi and t % mod == 0), default=None)


def is_present_in(have: Have, t: int) -> bool:
    """Return whether t ∈ have."""
    return has_boundary(have, t) if isinstance(have, Boundaries) else t in have

RULE_TAIL_MISSING = "tail-key-missing"


@attrs.frozen(kw_only=True)
class SpecGroup:
    """Groups with identical (kind, block size), merged: present only when every member is."""

    kind: str
    block_size: int
    members: tuple[GroupId, ...]
    eagle: bool


@attrs.frozen(kw_only=True)
class LookupStep:
    """One finder evaluation of the fixed point (for the explain trace)."""

    round: int  # 0: bound ⌊N/a⌋·a, 1: the N-1 re-derivation
    pass_no: int
    spec_group: int
    members: tuple[GroupId, ...]
    action: str  # "find" | "cap"
    bound: Tokens  # the length the group was asked to accept (before the peek margin)
    search_bound: Tokens  # bound after the peek margin
    eagle_drop: bool
    result: Tokens


# one finder evaluation as the fixed point records it: LookupStep's fields in order (a plain tuple: the exhaustive runs
# evaluate millions of lookups and read no trace, `kvspec explain` reads LookupResult.steps)
StepRecord = tuple[int, int, int, tuple[GroupId, ...], str, Tokens, Tokens, bool, Tokens]


@attrs.frozen(kw_only=True)
class LookupResult:
    """The hit length h and how it was reached."""

    hit_length: Tokens
    bound: Tokens
    rederived: bool
    trace: tuple[StepRecord, ...]

    @property
    def steps(self) -> tuple[LookupStep, ...]:
        """Return the trace as LookupStep values, in evaluation order."""
        return tuple(LookupStep(round=r, pass_no=p, spec_group=i, members=m, action=a, bound=b, search_bound=sb,
                                eagle_drop=d, result=x) for r, p, i, m, a, b, sb, d, x in self.trace)


@functools.lru_cache(maxsize=4096)  # pure over a frozen value: memoized for exhaustive runs
def compute_spec_groups(geometry: Geometry) -> tuple[SpecGroup, ...]:
    """Return the merged spec groups, attention first, each kind in first-appearance order."""
    order: dict[tuple[str, int], list[GroupId]] = {}
    for gid, g in enumerate(geometry.groups):
        order.setdefault((g.kind, g.block_size), []).append(GroupId(gid))
    merged = [SpecGroup(kind=k, block_size=b, members=tuple(ms), eagle=is_eagle_spec(geometry, ms[0]))
              for (k, b), ms in order.items()]
    return tuple(sorted(merged, key=lambda sg: 0 if sg.kind == "attention" else 1))


@functools.lru_cache(maxsize=64)  # one present set is read by the fixed point, the best hit and the witness
def compute_present_by_group(present: ObjSet) -> Mapping[GroupId, Have]:
    """Return each group's present boundaries: {g: {t : (g, t) ∈ E}} (groups with none left out)."""
    if isinstance(present, Objects):
        return present.by_group
    per: dict[GroupId, set[Boundary]] = {}
    for g, t in present:
        per.setdefault(g, set()).add(t)
    return {g: frozenset(ts) for g, ts in per.items()}


@functools.lru_cache(maxsize=256)
def compute_group_present(present: ObjSet, members: tuple[GroupId, ...]) -> Have:
    """Return the boundaries present for every member of a spec group: ∩_m {t : (m, t) ∈ E}."""
    if isinstance(present, Objects):
        out_b = compute_group_boundaries(present, members[0])
        for m in members[1:]:
            out_b = compute_intersection(out_b, compute_group_boundaries(present, m))
        return out_b
    per = cast(Mapping[GroupId, frozenset[Boundary]], compute_present_by_group(present))
    out = per.get(members[0], frozenset())
    for m in members[1:]:
        out = out & per.get(m, frozenset())
    return out


def compute_peek_margin(geometry: Geometry, span: Tokens) -> Tokens:
    """Return the EAGLE peek margin: u in fine mode when s > u, else s."""
    return Tokens(geometry.unit if is_fine(geometry) and span > geometry.unit else span)


def find_attention_hit(geometry: Geometry, span: Tokens, have: Have, bound: Tokens,
                       drop: bool) -> Tokens:
    """Return an attention spec group's hit: full blocks, then the first non-full block's unit boundaries, then the EAGLE drop."""
    u, a = geometry.unit, compute_alignment(geometry)
    nb = min(compute_full_run(have, span), bound // span)
    hit = nb * span
    if is_fine(geometry):
        top = min((nb + 1) * span - u, bound // u * u)
        inside = find_largest_in(have, nb * span, top, u)
        if inside is not None:
            hit = inside
    if drop and hit > 0:
        hit -= min(a, span)
    return Tokens(max(hit, 0) // a * a)


def find_mamba_hit(geometry: Geometry, block_size: int, have: Have, bound: Tokens) -> Tokens:
    """Return a Mamba spec group's hit: its highest present boundary within the bound (a multiple of u, or of b and a)."""
    u, a = geometry.unit, compute_alignment(geometry)
    mod = u if is_fine(geometry) else math.lcm(block_size, a)
    return Tokens(find_largest_in(have, 0, bound, mod) or 0)


Finder = Callable[[Geometry, SpecGroup, Have, Tokens, Tokens, bool], tuple[Tokens, Tokens]]


def run_attention_finder(geometry: Geometry, sg: SpecGroup, have: Have, cur: Tokens,
                         max_len: Tokens, drop: bool) -> tuple[Tokens, Tokens]:
    """Return (search bound, hit) of an attention spec group asked to accept cur; the peek margin only with the drop."""
    span = compute_span(geometry, sg.members[0])
    search = Tokens(min(cur + compute_peek_margin(geometry, span), max_len)) if drop else cur
    return search, find_attention_hit(geometry, span, have, search, drop)


def run_mamba_finder(geometry: Geometry, sg: SpecGroup, have: Have, cur: Tokens,
                     max_len: Tokens, drop: bool) -> tuple[Tokens, Tokens]:
    """Return (search bound, hit) of a Mamba spec group: never a margin, never a drop (#43559)."""
    return cur, find_mamba_hit(geometry, sg.block_size, have, cur)


FINDERS: Mapping[str, Finder] = {"attention": run_attention_finder, "mamba": run_mamba_finder}


def compute_fixed_point(geometry: Geometry, present: ObjSet, max_len: Tokens, round_no: int = 0,
                        finders: Mapping[str, Finder] = FINDERS) -> tuple[Tokens, tuple[StepRecord, ...]]:
    """Return the length every spec group accepts, starting from max_len, and the trace."""
    groups = compute_spec_groups(geometry)
    have = [compute_group_present(present, sg.members) for sg in groups]
    steps: list[StepRecord] = []

    def run(idx: int, cur: Tokens, drop: bool, pass_no: int) -> Tokens:
        sg = groups[idx]
        search, new = finders[sg.kind](geometry, sg, have[idx], cur, max_len, drop)
        steps.append((round_no, pass_no, idx, sg.members, "find", cur, search, drop, new))
        return new

    if len(groups) == 1:
        sg = groups[0]
        return run(0, max_len, sg.kind == "attention" and sg.eagle, 1), tuple(steps)
    simple = len(groups) == 2 and groups[0].kind == "attention" and groups[1].kind == "mamba"
    hit = max_len
    cached: dict[int, Tokens] = {}
    verified: set[int] = set()
    pass_no = 0
    while True:
        pass_no += 1
        cur = hit
        for idx, sg in enumerate(groups):
            if sg.kind == "attention" and idx in cached:
                cur = Tokens(min(cur, cached[idx]))
                steps.append((round_no, pass_no, idx, sg.members, "cap", cur, cur, False, cur))
                continue
            drop = sg.kind == "attention" and sg.eagle and idx not in verified
            new = run(idx, cur, drop, pass_no)
            if drop:
                verified.add(idx)
            elif new < cur:
                verified.clear()
            cur = new
            if sg.kind == "attention":
                cached[idx] = new
        if cur >= hit:
            break
        hit = cur
        if simple:
            break
    return hit, tuple(steps)


def compute_lookup(geometry: Geometry, present: ObjSet, prompt: Tokens,
                   finders: Mapping[str, Finder] = FINDERS, cap: Tokens | None = None,
                   lookahead: int = 0) -> LookupResult:
    """Return the hit length h for N tokens: bound ⌊(N − λ)/a⌋·a (and <= cap), re-derived below N when h >= N."""
    a = compute_alignment(geometry)
    bound = Tokens(max(min(prompt - lookahead, cap if cap is not None else prompt), 0) // a * a)
    if bound <= 0:
        return LookupResult(hit_length=Tokens(0), bound=bound, rederived=False, trace=())
    hit, steps = compute_fixed_point(geometry, present, bound, finders=finders)
    if hit < prompt:
        return LookupResult(hit_length=hit, bound=bound, rederived=False, trace=steps)
    bound2 = Tokens((prompt - 1) // a * a)
    if bound2 <= 0:
        return LookupResult(hit_length=Tokens(0), bound=bound2, rederived=True, trace=steps)
    hit2, steps2 = compute_fixed_point(geometry, present, bound2, round_no=1, finders=finders)
    return LookupResult(hit_length=hit2, bound=bound2, rederived=True, trace=steps + steps2)


def compute_full_run(have: Have, span: Tokens) -> int:
    """Return the number of full blocks stored from the start: the largest k with j·s ∈ have for every 1 <= j <= k."""
    if isinstance(have, Boundaries):
        return compute_whole_run(have, span)
    k = 0
    while (k + 1) * span in have:
        k += 1
    return k


def is_attention_servable(unit: int, span: Tokens, have: Have, run: int, x: Tokens,
                          top: Tokens) -> bool:
    """Return whether an attention group can load [0, x): its full blocks below x stored (⌊x/s⌋ <= run) and, unless
    x ends one, a stored unit boundary in [x, min(the end of x's block, top)] (fine mode: s ∤ x only happens there)."""
    if x <= 0 or x % span == 0:
        return x // span <= run
    end = min(-(-x // span) * span, top)
    return x // span <= run and find_smallest_in(have, x - 1, end, unit) is not None


def compute_best_at(geometry: Geometry, present: ObjSet, bound: Tokens, top: Tokens | None = None) -> Tokens:
    """Return the largest multiple h of a <= bound where every Mamba spec group holds a state at h, every attention
    spec group can serve h and an EAGLE one can serve h + min(a, s) (the drop), with tail keys up to `top` (default
    the bound), searched from the top (0 if none). A brute force over explicit sets: a compact E is listed first."""
    top = bound if top is None else top
    a, u = compute_alignment(geometry), geometry.unit
    groups = compute_spec_groups(geometry)
    have = [compute_group_present(frozenset(present), sg.members) for sg in groups]
    states = [cast(frozenset[Boundary], hv) for sg, hv in zip(groups, have) if sg.kind == "mamba"]
    # candidates: every multiple of a, or (with Mamba groups) only the boundaries where each holds a state
    cands: Iterable[int] = (range(bound // a * a, 0, -a) if not states else
                            sorted((t for t in frozenset.intersection(*states) if 0 < t <= bound and t % a == 0),
                                   reverse=True))
    attention = []
    for sg, hv in zip(groups, have):
        if sg.kind == "attention":
            span = compute_span(geometry, sg.members[0])
            attention.append((span, hv, compute_full_run(hv, span), min(a, span) if sg.eagle else 0))
    for h in cands:
        if all(is_attention_servable(u, span, hv, run, Tokens(h + peek), top) for span, hv, run, peek in attention):
            return Tokens(h)
    return Tokens(0)


def compute_best_hit(geometry: Geometry, present: ObjSet, prompt: Tokens, lookahead: int = 0) -> Tokens:
    """Return the best hit the rules allow given E: compute_best_at(⌊(N − λ)/a⌋·a), or at ⌊(N − 1)/a⌋·a when that is >= N.

    A brute-force statement of "largest", independent of the fixed point (checked against it: MAX-HIT).
    """
    a = compute_alignment(geometry)
    best = compute_best_at(geometry, present, Tokens(max(prompt - lookahead, 0) // a * a))
    if best < prompt:
        return best
    return compute_best_at(geometry, present, Tokens(max(prompt - 1, 0) // a * a))


def compute_physical_best(geometry: Geometry, present: ObjSet, prompt: Tokens, lookahead: int = 0) -> Tokens:
    """Return the best hit any lookup could load from E: the largest multiple h of a below N with every Mamba state at
    h and every attention group able to serve h (h + min(a, s) with EAGLE) from tail keys up to ⌊(N − λ)/u⌋·u."""
    a, u = compute_alignment(geometry), geometry.unit
    return compute_best_at(geometry, present, Tokens(max(prompt - 1, 0) // a * a),
                           Tokens(max(prompt - lookahead, 0) // u * u))


def compute_resend_best(geometry: Geometry, prompt: Tokens, lookahead: int = 0) -> Tokens:
    """Return the best hit of an identical resend of P tokens: ⌊(P − max(1, λ))/a⌋·a, and max(⌊P/a⌋·a − a, 0) with the
    EAGLE drop (λ = 0: the token after the drafter's last position must be verified by a hash)."""
    a = compute_alignment(geometry)
    if lookahead == 0 and any(g.eagle for g in geometry.groups):
        return Tokens(max(prompt // a * a - a, 0))
    return Tokens(max(prompt - max(1, lookahead), 0) // a * a)


def compute_tail_block(span: Tokens, hit: Tokens) -> int:
    """Return c = ⌈h/s⌉ - 1, the block holding token h-1."""
    return -(-hit // span) - 1


def compute_tail_boundary(geometry: Geometry, present: ObjSet, prompt: Tokens, hit: Tokens,
                          group: GroupId, rule: str = TAIL_STORED, lookahead: int = 0) -> Boundary:
    """Return B_g: h if (g, h) is present, else the smallest present unit boundary in (h, min((c+1)·s, ⌊(N−λ)/u⌋·u)] (legacy: h)."""
    if rule == TAIL_HIT or (group, Boundary(hit)) in present:
        return Boundary(hit)
    u, s = geometry.unit, compute_span(geometry, group)
    top = min((compute_tail_block(s, hit) + 1) * s, max(prompt - lookahead, 0) // u * u)
    found = find_smallest_in(compute_present_by_group(present).get(group, frozenset()), hit, top, u)
    if found is None:
        raise SpecError(RULE_TAIL_MISSING, f"no stored tail key for group {group} at hit length {hit}")
    return Boundary(found)


def compute_tail_boundaries(geometry: Geometry, present: ObjSet, prompt: Tokens, hit: Tokens,
                            rule: str = TAIL_STORED, lookahead: int = 0) -> tuple[tuple[GroupId, Boundary], ...]:
    """Return (g, B_g) for every group when h > 0, else ()."""
    if hit <= 0:
        return ()
    return tuple((GroupId(g), compute_tail_boundary(geometry, present, prompt, hit, GroupId(g), rule, lookahead))
                 for g in range(len(geometry.groups)))
