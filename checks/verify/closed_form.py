"""The closed form of the attention + Mamba lookup (equal block size b = q·u), over the ops shim.

The executable fixed point of ``spec/lookup.py`` is what the spec *is*; this module states,
for the geometry the PR is about (one attention group of span s = b·D and one Mamba group of
span b, optionally an equal-spec draft group), the length it converges to in closed form,
using the store rule's sets.  The Z3 theorems are proved on this closed form; the link
"closed form == executable spec" is checked exhaustively on small scopes and by Hypothesis
at large scale (``checks/verify/link.py``).

The closed form counts in **units**: every boundary the store rule or the lookup produces is a
multiple of u, so it is computed as a unit count (m = q·D units per attention block, q per Mamba
block) and scaled by u only in the witness.  The prompts enter through ⌊P/u⌋, ⌊(P−1)/u⌋,
⌊N/u⌋, ⌊(N−1)/u⌋ and ⌊S/u⌋.  This keeps u out of every division but the first ones, which is
what lets the solver prove the theorems with D, q and u all symbolic.  Derivation notes:

* With b_a = b_m = b: L = s = b·D; fine iff D > 1 or b > u (m > 1); in coarse mode (D = 1,
  b = u) a = L = u, so a = u always: a bound ⌊N/a⌋·a is ⌊N/u⌋ units.
* Attention stores {k·m <= F} (F = ⌊P_u/m⌋·m) plus, when the tail is stored, exactly {T}
  (T = P_u − e is not a multiple of q, so not of m, and lies in block ⌈T/m⌉ − 1 <= F/m).
* Mamba stores {j·q <= R} (dense) or {R} (replay, R > 0), R = ⌊⌊(P−1)/u⌋/q⌋·q, plus T when
  the tail is stored.
* Simple hybrid: attention runs once at the bound (its peek margin is clamped to the bound),
  Mamba once at the attention result; the fixed point stops after one pass.  A hit h with
  u·h >= N is re-derived once at the bound ⌊(N−1)/u⌋ (``sel`` is the bound finally used).

The proofs are cut in three (``checks/verify/prove.py``): a lemma proves that the hit has the shape
:func:`is_hit_shaped`; a second proves the unit-level tail facts :func:`has_tail_facts` for *every*
hit of that shape (the hit's definition left out); each theorem is then proved from the two
lemmas with the hit and the tails left opaque.  All three with u, q, D and the prompts symbolic.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.spec.invariants import MISSING, GroupView, Witness
from kvspec.spec.ops import IntOps
from kvspec.spec.rules import LOOKAHEAD_ALWAYS, PR53324, STORE_VLLM_0_33, VLLM_0_33, VLLM_0_33_LOOKAHEAD, get_rules


@attrs.frozen(kw_only=True)
class Params:
    """The free parameters of the closed form (ints or Z3 terms)."""

    u: Any
    q: Any  # b = q·u
    d: Any  # DCP size
    e: Any  # 1: the attention group carries the EAGLE flag (so e = 1 in the store rule)
    dense: Any  # 1: dense Mamba retention, 0: replay
    p: Any  # stored prompt P
    n: Any  # lookup prompt N
    s_shared: Any  # shared prefix S
    states: Any = None  # the Mamba states the stored request left, a membership test over units (StateSet on ints,
    #                     an uninterpreted function in Z3): any chunk schedule's; None: the block schedule's (retention)


def pre_params(ops: Any, x: Params) -> Any:
    """Return the precondition of the closed form: positive sizes, flags in {0, 1}, 0 <= S <= min(P, N)."""
    return ops.And(x.u >= 1, x.q >= 1, x.d >= 1, ops.Or(x.e == 0, x.e == 1), ops.Or(x.dense == 0, x.dense == 1),
                   x.p >= 0, x.n >= 1, x.s_shared >= 0, x.s_shared <= x.p, x.s_shared <= x.n)


@attrs.frozen(kw_only=True)
class ClosedForm:
    """Every closed-form quantity, in units (terms over the ops of construction)."""

    m: Any  # attention span in units (q·D)
    n_units: Any  # ⌊N/u⌋ (the bound and the top of the tail scan)
    n_below: Any  # ⌊(N−1)/u⌋ (u·h < N iff h <= n_below)
    s_units: Any  # ⌊S/u⌋
    full: Any  # F
    tail: Any  # T
    tail_vis: Any  # T is stored and visible (within S)
    sel: Any  # the bound the hit was derived at
    nb: Any  # attention full blocks usable at sel
    inside: Any  # the attention tail T ends the attention hit at sel
    reach: Any  # r: the attention hit at sel before the EAGLE drop
    hit: Any  # h
    mamba_calls: tuple[tuple[Any, Any], ...]  # (attention hit y, Mamba hit) at ⌊N/u⌋ and at ⌊(N−1)/u⌋
    tail_attention: Any  # B_att (MISSING when none)
    tail_mamba: Any  # B_mamba (MISSING when none)
    replay: Any = None  # R = ⌊⌊(P−1)/u⌋/q⌋·q, the replay checkpoint (units)
    retention: tuple[Any, ...] = ()  # the Mamba states retention keeps (R; vLLM's EAGLE R1, R2)
    mamba_below: Any = None  # t ↦ the largest stored, visible Mamba state <= t (0: none), the rule set's own
    checkpoint: Any = None  # C (units) under vLLM's store rule
    hashed: Any = None  # the last boundary with a hash (units)
    top: Any = None  # the lookup's first bound and the top of its tail scan: ⌊N/u⌋, with hash lookahead ⌊(N−1)/u⌋
    eagle: Any = 0  # 1: the EAGLE drop applies (the flag, and no hash lookahead)
    attention_below: Any = None  # β ↦ (nb, inside, r, y): the attention finder at bound β (y: after the EAGLE drop)
    attention_calls: tuple[tuple[Any, ...], ...] = ()  # (β, nb, inside, r, y) at the first bound and at ⌊(N−1)/u⌋


@attrs.frozen
class StateSet:
    """A finite set of Mamba states in units, callable as its membership test (the ints backend of Params.states)."""

    units: frozenset[int]

    def __call__(self, t: int) -> bool:
        """Return whether a state is at t."""
        return t in self.units


VLLM = VLLM_0_33
LOOKAHEAD = VLLM_0_33_LOOKAHEAD  # vLLM 0.33.0's rules with hash lookahead λ = 1 (kvspec's proposal)
VLLM_RULES = (VLLM, LOOKAHEAD)  # the rule sets with vLLM 0.33.0's store rule that have a closed form


def read_closed_rules(rule: str) -> tuple[bool, bool]:
    """Return (hash lookahead on, vLLM's store rule) from the rule set's fields — what the closed forms read of it.
    They are stated for λ ∈ {0, 1} applied on every geometry; a rule set outside that has no closed form here."""
    rs = get_rules(rule)
    if rs.lookahead not in (0, 1) or (rs.lookahead and rs.lookahead_scope != LOOKAHEAD_ALWAYS):
        raise ValueError(f"no closed form for rule set {rule} (λ = {rs.lookahead}, scope {rs.lookahead_scope})")
    return rs.lookahead == 1, rs.store == STORE_VLLM_0_33


def compute_closed_form(ops: Any, x: Params, rule: str = PR53324, cap: Any = None,
                        name_reaches: bool = False) -> tuple[ClosedForm, Any, Any]:
    """Return the closed form and the membership functions of E, in units, under the PR's store rule, vLLM 0.33.0's,
    or vLLM 0.33.0's with hash lookahead λ = 1; with `cap` (units), the lookup's first bound is min(bound, cap) (the
    retry after a failed load: spec/lookup.py compute_lookup(cap=...)); with `name_reaches`, each attention reach is a
    definition of its own (the efficiency queries leave it out; the other theorems were tuned without the names).

    vLLM 0.33.0 (rule "vllm-0.33.0"): the checkpoint C = ⌊P/u⌋ − 1 with EAGLE, else ⌊(P−1)/u⌋ (a = u here);
    attention publishes its blocks up to C + e, so its one boundary off the block grid is T = C + e (fine mode,
    C > 0, T not a multiple of m); Mamba keeps the state at C and, dense, every block end up to ⌊P/u⌋, replay,
    ⌊(P−1)/u⌋ aligned to q, or with EAGLE ⌊⌊(P−1)/u⌋/m⌋·m − m and ⌊⌊P/u⌋/m⌋·m − m.
    With hash lookahead λ = 1 on every geometry (read_closed_rules: the rule set's `lookahead` and `lookahead_scope`
    fields, e.g. vllm-0.33.0-lookahead): no EAGLE drop (e = 0 whatever the flag); a hash names [0, t + 1), so
    the last boundary with a hash is ⌊(P−1)/u⌋ (full blocks and dense states stop there, C = ⌊(P−1)/u⌋), an
    object is visible when t + 1 <= S (t <= ⌊(S−1)/u⌋), and the lookup's bound and tail scan end at ⌊(N−1)/u⌋.
    """
    lookahead, vllm = read_closed_rules(rule)
    if x.states is not None and not vllm:
        raise ValueError(f"rule set {rule} assumes the block schedule: no closed form over Mamba states")
    q, e = x.q, (0 if lookahead else x.e)
    m = ops.let("m", q * x.d)
    fine = m > 1
    pu = ops.let("Pu", ops.floordiv(x.p, x.u))
    p1 = ops.let("P1u", ops.floordiv(ops.max(x.p - 1, 0), x.u))
    nu = ops.let("Nu", ops.floordiv(x.n, x.u))
    n1 = ops.let("N1u", ops.floordiv(x.n - 1, x.u))
    # visible: t <= ⌊S/u⌋, or with lookahead t + 1 <= S, i.e. t <= ⌊(S−1)/u⌋ (clamped at 0: every boundary is >= 1)
    su = ops.let("Su", ops.floordiv(ops.max(x.s_shared - 1, 0), x.u) if lookahead else ops.floordiv(x.s_shared, x.u))
    hashed = p1 if lookahead else pu  # the last boundary with a hash (units)
    top = n1 if lookahead else nu  # the lookup's bound and the top of its tail scan (units)
    full = ops.let("F", ops.min(ops.floordiv(pu, m) * m, p1) if lookahead else ops.floordiv(pu, m) * m)
    replay = ops.let("R", ops.floordiv(p1, q) * q)
    r1 = r2 = replay  # vLLM's EAGLE replay points (with e = 0 only R is kept)
    if vllm:
        ck = ops.let("C", p1 if lookahead else ops.If(e == 1, ops.max(pu - 1, 0), p1))
        tail = ops.let("T", ck + e)
        tail_vis = ops.let("tail_vis", ops.And(fine, ck > 0, ops.mod(tail, m) != 0, tail <= su))
        if not lookahead:
            r1 = ops.let("R1", ops.max(ops.floordiv(p1, m) * m - m, 0))
            r2 = ops.let("R2", ops.max(ops.floordiv(pu, m) * m - m, 0))
    else:
        tail = ops.let("T", pu - e)
        tail_vis = ops.let("tail_vis", ops.And(fine, tail > 0, ops.mod(tail, q) != 0, tail <= su))

    def att_has(t: Any) -> Any:
        return ops.Or(ops.And(t >= 1, ops.divides(m, t), t <= full, t <= su), ops.And(tail_vis, t == tail))

    def mam_has(t: Any) -> Any:
        if x.states is not None:  # any schedule: a state it left on a Mamba block end with a hash, or at C
            return ops.And(t >= 1, t <= su, x.states(t),
                           ops.Or(ops.And(ops.divides(q, t), t <= hashed), ops.And(ck > 0, t == ck)))
        if vllm:
            dense = ops.And(t >= 1, ops.divides(q, t), t <= hashed, t <= su)
            kept = ops.And(t >= 1, t <= su, ops.If(e == 1, ops.Or(t == r1, t == r2), t == replay))
            return ops.Or(ops.If(x.dense == 1, dense, kept), ops.And(ck > 0, t == ck, t <= su))
        ckpt = ops.And(t >= 1, ops.divides(q, t), t <= replay, t <= su, ops.Or(x.dense == 1, t == replay))
        return ops.Or(ckpt, ops.And(tail_vis, t == tail))

    def attention_at(bound: Any) -> tuple[Any, Any, Any, Any]:
        nb = ops.floordiv(ops.min(ops.min(full, su), bound), m)
        inside = ops.And(tail_vis, nb * m < tail, tail <= (nb + 1) * m - 1, tail <= bound)
        r = ops.If(inside, tail, nb * m)
        if name_reaches:  # a definition of its own, which a query can leave out (the efficiency steps)
            r = ops.let("r", r)
        return nb, inside, r, ops.let("y", ops.max(ops.If(ops.And(e == 1, r > 0), r - 1, r), 0))

    def mamba_at(h_att: Any) -> Any:
        if x.states is not None:  # the largest such state <= min(⌊S/u⌋, h_att) (Z3: any one, see ops.pick_below)
            return ops.pick_below("h_m", ops.min(su, h_att), mam_has, at_least=(ck,))
        if vllm:
            lim = ops.min(su, h_att)

            def kept(t: Any) -> Any:
                return ops.If(ops.And(t > 0, t <= lim), t, 0)

            dense = ops.floordiv(ops.max(ops.min(hashed, lim), 0), q) * q
            part = ops.If(x.dense == 1, dense, ops.If(e == 1, ops.max(kept(r1), kept(r2)), kept(replay)))
            return ops.let("h_m", ops.max(part, kept(ck)))
        ckpt = ops.If(x.dense == 1, ops.floordiv(ops.max(ops.min(ops.min(replay, su), h_att), 0), q) * q,
                      ops.If(ops.And(replay > 0, replay <= su, replay <= h_att), replay, 0))
        tail_m = ops.If(ops.And(tail_vis, tail <= h_att), tail, 0)
        return ops.let("h_m", ops.max(ckpt, tail_m))

    first = top if cap is None else ops.min(top, cap)  # the first bound (capped on a retry); the re-derivation is not
    at_top, at_below = attention_at(first), attention_at(n1)
    calls = ((at_top[3], mamba_at(at_top[3])), (at_below[3], mamba_at(at_below[3])))
    h1 = ops.let("h1", ops.If(first <= 0, 0, calls[0][1]))
    again = h1 > n1  # u·h1 >= N: derive again at ⌊(N−1)/u⌋
    sel = ops.let("sel", ops.If(again, n1, first))
    nb, inside, r = (ops.let(name, ops.If(again, lo, hi)) for name, lo, hi in
                     zip(("nb", "inside", "r"), at_below[:3], at_top[:3]))
    hit = ops.let("h", ops.If(again, ops.If(n1 <= 0, 0, calls[1][1]), h1))

    def tail_of(has: Any, span: Any) -> Any:
        c = ops.cdiv(hit, span) - 1
        end = (c + 1) * span
        t_in = ops.And(tail_vis, hit < tail, tail <= end, tail <= top)
        full_in = ops.And(has(end), hit < end, end <= top)
        return ops.let("B", ops.If(hit <= 0, MISSING, ops.If(has(hit), hit, ops.If(t_in, tail,
                                                                                   ops.If(full_in, end, MISSING)))))

    cf = ClosedForm(m=m, n_units=nu, n_below=n1, s_units=su, full=full, tail=tail, tail_vis=tail_vis, sel=sel, nb=nb,
                    inside=inside, reach=r, hit=hit, mamba_calls=calls, tail_attention=tail_of(att_has, m),
                    tail_mamba=tail_of(mam_has, q), replay=replay, retention=(replay, r1, r2), mamba_below=mamba_at,
                    checkpoint=ck if vllm else None, hashed=hashed, top=top, eagle=e, attention_below=attention_at,
                    attention_calls=((first, *at_top), (n1, *at_below)))
    return cf, att_has, mam_has


def is_mamba_fact(ops: Any, cf: ClosedForm, mam_has: Any, y: Any, hm: Any) -> Any:
    """Return whether a Mamba hit hm (from a bound y) is 0 or a stored state within y and ⌊S/u⌋."""
    return ops.And(hm >= 0, ops.Implies(hm > 0, ops.And(hm <= y, hm <= cf.s_units, mam_has(hm))))


def has_mamba_facts(ops: Any, cf: ClosedForm, mam_has: Any) -> Any:
    """Return whether each Mamba hit hm (from an attention hit y) is 0 or a stored state within y and ⌊S/u⌋."""
    return ops.And(*(is_mamba_fact(ops, cf, mam_has, y, hm) for y, hm in cf.mamba_calls))


def is_hit_shaped(ops: Any, cf: ClosedForm, mam_has: Any) -> Any:
    """Return whether the hit has the shape the tail lemma needs (the cut between hit and tails).

    sel is ⌊N/u⌋ or ⌊(N−1)/u⌋; nb·m is an attention prefix within F, ⌊S/u⌋ and sel; when the
    tail ends the attention hit, T is visible and in block nb, within sel; the reach r is T or nb·m;
    h = 0, or 0 < h <= r, h <= ⌊(N−1)/u⌋, h <= ⌊S/u⌋ and every Mamba group has its state stored at h.
    """
    h, nb, m = cf.hit, cf.nb, cf.m
    return ops.And(ops.Or(cf.sel == cf.n_units, cf.sel == cf.n_below), h >= 0, nb >= 0, nb * m <= cf.full,
                   nb * m <= cf.s_units, nb * m <= cf.sel,
                   ops.Implies(cf.inside, ops.And(cf.tail_vis, nb * m < cf.tail, cf.tail <= nb * m + m - 1,
                                                  cf.tail <= cf.sel)),
                   cf.reach == ops.If(cf.inside, cf.tail, nb * m),
                   ops.Implies(h > 0, ops.And(cf.sel >= 1, h <= cf.reach, h <= cf.n_below, h <= cf.s_units,
                                              mam_has(h))))


def has_tail_facts(ops: Any, x: Params, cf: ClosedForm, att_has: Any, mam_has: Any) -> Any:
    """Return the unit-level tail facts every scenario theorem needs (quantifier-free).

    For h > 0: B_att is a stored attention boundary in h's block c (c·m < B_att <= (c+1)·m),
    h <= B_att <= ⌊N/u⌋, and the full blocks before c are within F and ⌊S/u⌋; B_mamba = h.  Block
    indices are stated as the divisions the theorems use, so both steps name the same quotients.
    """
    h, m, b = cf.hit, cf.m, cf.tail_attention
    c = ops.cdiv(h, m) - 1
    return ops.Implies(h > 0, ops.And(b >= 1, h <= b, b <= (c + 1) * m, c * m < b, ops.cdiv(b, m) - 1 == c,
                                      att_has(b), b <= cf.n_units, c * m <= cf.full, c * m <= cf.s_units,
                                      cf.tail_mamba == h, ops.cdiv(cf.tail_mamba, x.q) == ops.cdiv(h, x.q)))


Gone = tuple[Any, Any]  # an evicted object (group: 0 attention, 1 Mamba; boundary in units), or None: nothing evicted


def compute_without(ops: Any, has: Any, group: int, gone: Gone | None) -> Any:
    """Return the membership test of a group's objects with the evicted one (if of that group) taken out."""
    if gone is None:
        return has
    return lambda t: ops.And(has(t), ops.Not(ops.And(gone[0] == group, t == gone[1])))


def is_closed_attention_servable(ops: Any, cf: ClosedForm, att_has: Any, x: Any, top: Any,
                                 gone: Gone | None = None) -> Any:
    """Return whether the attention group can load [0, x) (x >= 1 units) from E minus `gone` with tail keys up to `top`
    (spec/lookup.py is_attention_servable): the full blocks up to ⌊x/m⌋·m stored and visible (none evicted) and,
    unless m divides x, a stored boundary in [x, min(⌈x/m⌉·m, top)] — the block end or the tail T, the only ones there."""
    m, att = cf.m, compute_without(ops, att_has, 0, gone)
    k = ops.floordiv(x, m) * m  # the full blocks x needs end here
    run = ops.And(k <= cf.full, k <= cf.s_units)
    if gone is not None:  # the stored full blocks are every multiple of m up to min(F, ⌊S/u⌋): one evicted cuts the run
        run = ops.And(run, ops.Not(ops.And(gone[0] == 0, gone[1] >= 1, gone[1] <= k, ops.divides(m, gone[1]))))
    end = ops.cdiv(x, m) * m
    lim = ops.min(end, top)
    edge = ops.Or(ops.And(att(end), end <= top), ops.And(cf.tail_vis, x <= cf.tail, cf.tail <= lim, att(cf.tail)))
    return ops.let("att_ok", ops.And(x >= 1, run, ops.Or(ops.divides(m, x), edge)))


def is_closed_servable(ops: Any, cf: ClosedForm, att_has: Any, mam_has: Any, t: Any, top: Any,
                       gone: Gone | None = None) -> Any:
    """Return whether a load of t units (t >= 1) can be served from E minus `gone` with tail keys up to `top`
    (spec/lookup.py compute_best_at, in units, a = u): a visible Mamba state at t, and the attention group serves
    t + e (the EAGLE drop)."""
    return ops.And(t >= 1, compute_without(ops, mam_has, 1, gone)(t),
                   is_closed_attention_servable(ops, cf, att_has, t + cf.eagle, top, gone))


def is_attention_maximal(ops: Any, cf: ClosedForm, att_has: Any, beta: Any, r: Any, x: Any) -> Any:
    """Return the attention finder's maximality at a bound β >= 0 (r its reach there), seen from any x: 0 <= r <=
    β; an x in [1, β] the group can serve with tail keys up to β is <= r; every x in [1, r] can be served; and an x
    past β can be served only on the block grid, within F and ⌊S/u⌋ (no tail key up to β reaches it)."""
    ok = is_closed_attention_servable(ops, cf, att_has, x, beta)
    return ops.And(r >= 0, r <= beta, ops.Implies(ops.And(x <= beta, ok), x <= r),
                   ops.Implies(ops.And(x >= 1, x <= r), ok),
                   ops.Implies(ops.And(x > beta, ok), ops.And(ops.divides(cf.m, x), x <= cf.full, x <= cf.s_units)))


def is_mamba_maximal(ops: Any, mam_has: Any, y: Any, hm: Any, t: Any) -> Any:
    """Return the Mamba finder's maximality at a bound y (hm its hit), seen from any t: a stored visible state at
    t in [1, y] is <= hm."""
    return ops.Implies(ops.And(t >= 1, t <= y, mam_has(t)), t <= hm)


def compute_best_top(ops: Any, cf: ClosedForm, att_has: Any, mam_has: Any, gone: Gone | None = None) -> Any:
    """Return the tail-key top the best hit is judged at (spec/lookup.py compute_best_hit): the lookup's first bound,
    or ⌊(N−1)/u⌋ when the first bound itself is servable and not below N (the best is then derived again there)."""
    first = cf.top
    again = ops.And(first > cf.n_below, is_closed_servable(ops, cf, att_has, mam_has, first, first, gone))
    return ops.let("best_top", ops.If(again, cf.n_below, first))


def is_closed_best(ops: Any, cf: ClosedForm, att_has: Any, mam_has: Any, h: Any, t: Any, top: Any,
                   gone: Gone | None = None) -> Any:
    """Return whether h is the best hit of E minus `gone` with tail keys up to `top`, as seen from a candidate t: h is
    0 or servable, h <= ⌊(N−1)/u⌋, and t is not a servable boundary in (h, ⌊(N−1)/u⌋] (for every t: h is the largest)."""
    return ops.And(h >= 0, h <= cf.n_below, ops.Or(h == 0, is_closed_servable(ops, cf, att_has, mam_has, h, top, gone)),
                   ops.Not(ops.And(h < t, t <= cf.n_below, is_closed_servable(ops, cf, att_has, mam_has, t, top, gone))))


def compute_closed_best(cf: ClosedForm, att_has: Any, mam_has: Any, physical: bool = False,
                        gone: Gone | None = None) -> int:
    """Return, on ints, the best hit of E minus `gone` in units: the largest servable t <= ⌊(N−1)/u⌋ (0 if none), with
    tail keys up to compute_best_top (MAX-HIT's best) or, `physical`, up to the first bound (BEST's)."""
    top = cf.top if physical else compute_best_top(IntOps, cf, att_has, mam_has, gone)
    return next((t for t in range(cf.n_below, 0, -1) if is_closed_servable(IntOps, cf, att_has, mam_has, t, top, gone)),
                0)


def compute_scaled(ops: Any, u: Any, t: Any) -> Any:
    """Return the boundary of a unit count t (MISSING stays MISSING)."""
    return ops.If(t < 0, MISSING, u * t)


def compute_closed_witness(ops: Any, x: Params, legacy: bool = False, draft: bool = False,
                           closed: tuple[ClosedForm, Any, Any] | None = None) -> Witness:
    """Return the witness of the closed form (`closed`, or computed) in tokens (tail keys at h under the legacy rule)."""
    cf, att_has, mam_has = closed if closed is not None else compute_closed_form(ops, x)
    u = x.u
    hit = u * cf.hit

    def in_tokens(has_units: Any) -> Any:
        return lambda t: ops.And(ops.divides(u, t), has_units(ops.floordiv(t, u)))

    def view(attention: bool, span: Any, tail: Any, has: Any) -> GroupView:
        c = ops.cdiv(cf.hit, span) - 1  # -1 at h = 0
        b_tok = compute_scaled(ops, u, tail)
        return GroupView(attention=attention, span=u * span, tail_block=c, tail=b_tok,
                         tail_key=hit if legacy else b_tok, has=in_tokens(has))

    att = view(True, cf.m, cf.tail_attention, att_has)
    mam = view(False, x.q, cf.tail_mamba, mam_has)
    groups = (att, att, mam) if draft else (att, mam)
    return Witness(unit=u, alignment=u, prompt=x.n, shared=x.s_shared, bound=u * cf.n_units, hit=hit,
                   groups=groups)


def compute_closed_safe(ops: Any, x: Params, cf: ClosedForm, f: Any, mok: Any) -> tuple[Any, Any, Any, Any]:
    """Return (safe boundary, attention loaded prefix cap, lim = min(cap, h − 1), the largest stored Mamba state <= lim)
    in units for a load whose first failed attention block is f (−1: none) and whose Mamba block loaded iff mok = 1:
    safe = h when nothing it needs failed, else that state (what a retry can load), else 0 (spec/failure.py)."""
    h = cf.hit
    cap = ops.let("cap", ops.If(f >= 0, ops.min(f * cf.m, h), h))
    lim = ops.let("lim", ops.min(cap, h - 1))
    below = cf.mamba_below(lim)  # the rule set's largest stored state short of h, within the loaded prefix
    safe = ops.let("safe", ops.If(h <= 0, 0, ops.If(ops.And(cap >= h, mok == 1), h, below)))
    return safe, cap, lim, below


def compute_closed_resend(ops: Any, x: Params, rule: str) -> Any:
    """Return the best hit of an identical resend in units (spec/lookup.py compute_resend_best with a = u):
    ⌊(P−1)/u⌋, and max(⌊P/u⌋ − 1, 0) with the EAGLE drop (no drop under hash lookahead)."""
    p1 = ops.floordiv(ops.max(x.p - 1, 0), x.u)
    return p1 if read_closed_rules(rule)[0] else ops.If(x.e == 1, ops.max(ops.floordiv(x.p, x.u) - 1, 0), p1)
