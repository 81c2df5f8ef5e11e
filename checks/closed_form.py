"""The closed form of the attention + Mamba lookup (equal block size b = q·u), over the ops shim.

The executable fixed point of ``spec/lookup.py`` is what the spec *is*; this module states,
for the geometry the PR is about (one attention group of span s = b·D and one Mamba group of
span b, optionally an equal-spec draft group), the length it converges to in closed form,
using the store rule's sets.  The Z3 theorems are proved on this closed form; the link
"closed form == executable spec" is checked exhaustively on small scopes and by Hypothesis
at large scale (``checks/link.py``).  Derivation notes:

* With b_a = b_m = b: L = s = b·D; fine iff D > 1 or b > u; in coarse mode (D = 1, b = u)
  a = L = u, so a = u always.
* Attention stores {k·s <= F} (F = ⌊P/s⌋·s) plus, when the tail is stored, exactly {T}
  (T is not a multiple of b, so not of s, and lies in block ⌈T/s⌉ - 1 <= F/s).
* Mamba stores {j·b <= R} (dense) or {R} (replay, R > 0), plus T when the tail is stored.
* Simple hybrid: attention runs once at the bound (its peek margin is clamped to the bound),
  Mamba once at the attention result; the fixed point stops after one pass.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.spec.invariants import MISSING, GroupView, Witness


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


def pre_params(ops: Any, x: Params) -> Any:
    """Return the precondition of the closed form: positive sizes, flags in {0, 1}, 0 <= S <= min(P, N)."""
    return ops.And(x.u >= 1, x.q >= 1, x.d >= 1, ops.Or(x.e == 0, x.e == 1), ops.Or(x.dense == 0, x.dense == 1),
                   x.p >= 0, x.n >= 1, x.s_shared >= 0, x.s_shared <= x.p, x.s_shared <= x.n)


@attrs.frozen(kw_only=True)
class ClosedForm:
    """Every closed-form quantity (terms over the ops of construction)."""

    b: Any
    s: Any
    a: Any
    fine: Any
    full: Any  # F
    tail: Any  # T
    tail_on: Any
    replay: Any  # R
    bound: Any
    hit: Any
    tail_attention: Any
    tail_mamba: Any


def compute_closed_form(ops: Any, x: Params) -> tuple[ClosedForm, Any, Any]:
    """Return the closed form and the membership functions (attention, Mamba) of E."""
    u, d, S = x.u, x.d, x.s_shared
    b = x.q * u
    s = b * d
    fine = ops.Or(d > 1, x.q > 1)
    a = ops.If(fine, u, s)
    full = ops.let("F", ops.floordiv(x.p, s) * s)
    tail = ops.let("T", ops.floordiv(x.p, u) * u - x.e * u)
    tail_on = ops.let("tail_on", ops.And(fine, tail > 0, ops.mod(tail, b) != 0))
    replay = ops.let("R", ops.floordiv(ops.max(x.p - 1, 0), b) * b)
    tail_vis = ops.let("tail_vis", ops.And(tail_on, tail <= S))

    def att_has(t: Any) -> Any:
        return ops.Or(ops.And(t >= 1, ops.divides(s, t), t <= full, t <= S), ops.And(tail_vis, t == tail))

    def mam_has(t: Any) -> Any:
        ckpt = ops.And(t >= 1, ops.divides(b, t), t <= replay, t <= S, ops.Or(x.dense == 1, t == replay))
        return ops.Or(ckpt, ops.And(tail_vis, t == tail))

    def hit_for(bound: Any) -> Any:
        nb = ops.let("nb", ops.floordiv(ops.min(ops.min(full, S), bound), s))
        inside = ops.And(fine, tail_vis, nb * s < tail, tail <= (nb + 1) * s - u, tail <= ops.floordiv(bound, u) * u)
        r = ops.If(inside, tail, nb * s)
        dropped = ops.If(ops.And(x.e == 1, r > 0), r - ops.min(a, s), r)
        h_att = ops.let("h_att", ops.floordiv(ops.max(dropped, 0), a) * a)
        ckpt = ops.If(x.dense == 1, ops.floordiv(ops.max(ops.min(ops.min(replay, S), h_att), 0), b) * b,
                      ops.If(ops.And(replay > 0, replay <= S, replay <= h_att), replay, 0))
        tail_m = ops.If(ops.And(tail_vis, tail <= h_att), tail, 0)
        return ops.let("h_m", ops.max(ckpt, tail_m))

    bound = ops.let("TL", ops.floordiv(x.n, a) * a)
    bound2 = ops.let("TL2", ops.floordiv(x.n - 1, a) * a)
    h1 = ops.If(bound <= 0, 0, hit_for(bound))
    hit = ops.let("h", ops.If(h1 >= x.n, ops.If(bound2 <= 0, 0, hit_for(bound2)), h1))
    top = ops.let("top", ops.floordiv(x.n, u) * u)

    def tail_of(has: Any, span: Any) -> Any:
        c = ops.let("c", ops.cdiv(hit, span) - 1)
        end = ops.let("end", (c + 1) * span)
        t_in = ops.And(tail_vis, hit < tail, tail <= end, tail <= top)
        full_in = ops.And(has(end), hit < end, end <= top)
        return ops.let("B", ops.If(hit <= 0, MISSING, ops.If(has(hit), hit, ops.If(t_in, tail, ops.If(full_in, end, MISSING)))))

    cf = ClosedForm(b=b, s=s, a=a, fine=fine, full=full, tail=tail, tail_on=tail_on, replay=replay, bound=bound,
                    hit=hit, tail_attention=tail_of(att_has, s), tail_mamba=tail_of(mam_has, b))
    return cf, att_has, mam_has


def compute_closed_witness(ops: Any, x: Params, legacy: bool = False, draft: bool = False) -> Witness:
    """Return the witness of the closed form (tail load keys at h under the legacy rule)."""
    cf, att_has, mam_has = compute_closed_form(ops, x)
    c_att = ops.If(cf.hit > 0, ops.cdiv(cf.hit, cf.s) - 1, -1)
    c_mam = ops.If(cf.hit > 0, ops.cdiv(cf.hit, cf.b) - 1, -1)
    att = GroupView(attention=True, span=cf.s, tail_block=c_att, tail=cf.tail_attention,
                    tail_key=cf.hit if legacy else cf.tail_attention, has=att_has)
    mam = GroupView(attention=False, span=cf.b, tail_block=c_mam, tail=cf.tail_mamba,
                    tail_key=cf.hit if legacy else cf.tail_mamba, has=mam_has)
    groups = (att, att, mam) if draft else (att, mam)
    return Witness(unit=x.u, alignment=cf.a, prompt=x.n, shared=x.s_shared, bound=cf.bound, hit=cf.hit,
                   groups=groups)
