"""The link between the Z3 closed form and the executable spec: equal on every checked input."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import attrs

from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.invariants import MISSING
from kvspec.spec.ops import IntOps
from kvspec.spec.scenario import Outcome, Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.types import GroupId

from .closed_form import ClosedForm, Params, compute_closed_form, compute_closed_safe, compute_scaled


@functools.lru_cache(maxsize=1024)  # a scope's inputs share few geometries: one value each (and warm spec caches)
def build_geometry(u: int, q: int, d: int, e: int, dense: int, draft: bool) -> Geometry:
    """Return the closed form's geometry: attention (EAGLE if e) + Mamba of block q·u, D = d, an equal-spec draft
    group (which then carries the EAGLE flag) if asked."""
    b = q * u
    groups = [Group(kind="attention", block_size=b, eagle=bool(e) and not draft)]
    if draft:
        groups.append(Group(kind="attention", block_size=b, eagle=bool(e)))
    groups.append(Group(kind="mamba", block_size=b))
    return Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=d), retention="dense" if dense else "replay")


def build_scenario(x: Params, draft: bool = False, rule: str = "pr53324") -> Scenario:
    """Return the executable scenario the closed form describes (with an equal-spec draft group if asked)."""
    g = build_geometry(x.u, x.q, x.d, x.e, x.dense, draft)
    return Scenario(geometry=g, prompt=x.n, stored=(StoredRequest(prompt=x.p, shared=x.s_shared),), rules=rule)


@functools.lru_cache(maxsize=1)  # a link pass compares one input's lookup and failure closure in turn
def compute_pair(x: Params, draft: bool, rule: str) -> tuple[ClosedForm, Scenario, Outcome]:
    """Return the closed form of an input and the spec's evaluation of the scenario it describes."""
    sc = build_scenario(x, draft, rule)
    return compute_closed_form(IntOps, x, rule)[0], sc, evaluate_scenario(sc)


def compare(x: Params, draft: bool = False, rule: str = "pr53324") -> str | None:
    """Return a description of the first difference between closed form and spec (under a rule set), or None."""
    cf, sc, out = compute_pair(x, draft, rule)
    if out.error is not None:
        return f"spec error {out.error}"
    tails = dict(out.tails)
    got = (out.hit_length, tails.get(GroupId(0), MISSING), tails.get(GroupId(len(sc.geometry.groups) - 1), MISSING))

    def tokens(t: int) -> int:
        return compute_scaled(IntOps, x.u, t) if cf.hit > 0 else MISSING

    want = (x.u * cf.hit, tokens(cf.tail_attention), tokens(cf.tail_mamba))
    if draft and tails.get(GroupId(1), MISSING) != tails.get(GroupId(0), MISSING):
        return f"draft tail {tails.get(GroupId(1))} != attention tail {tails.get(GroupId(0))} for {x}"
    return None if got == want else f"spec (h, B_att, B_mamba) = {got} but closed form = {want} for {x}"


def compare_failure(x: Params, rule: str = "pr53324") -> str | None:
    """Return the first load result whose closed-form safe boundary differs from spec/failure.py's (under a rule
    set), or None.

    Every first failed attention block f (or none) with the Mamba block loaded or not.
    """
    from kvspec.spec.failure import compute_safe_boundary
    from kvspec.spec.invariants import compute_failure_witness
    from kvspec.spec.lookup import compute_tail_block
    cf, sc, out = compute_pair(x, False, rule)
    h = out.hit_length
    if h <= 0:
        return None
    g = sc.geometry
    mamba = len(g.groups) - 1
    for f in range(-1, compute_tail_block(x.q * x.u * x.d, h) + 1):
        for mok in (0, 1):
            ok = tuple((e.group != 0 or e.block != f) and (e.group != mamba or mok == 1) for e in out.load)
            want = compute_safe_boundary(g, out.present, h, out.load, ok)
            safe = compute_closed_safe(IntOps, x, cf, f, mok)[0]
            if x.u * safe != want:
                return f"spec safe {want} but closed form {x.u * safe} (f={f}, mok={mok}) for {x}"
            if not all(ok):  # the retry: the rule set's lookup capped at the safe boundary (F-7)
                retry = compute_failure_witness(sc, out, ok).retry_hit
                got = x.u * compute_closed_form(IntOps, x, rule, cap=safe)[0].hit
                if got != retry:
                    return f"spec retry hit {retry} but closed form {got} (f={f}, mok={mok}, safe={want}) for {x}"
    return None


def iterate_small_scope(dcps: tuple[int, ...] = (1, 2, 4, 8), units: tuple[int, ...] = (1, 2, 4),
                        max_q: int = 4, blocks: int = 2) -> Iterator[Params]:
    """Yield every closed-form input of a small scope: prompts up to `blocks` attention spans, every shared prefix."""
    for d in dcps:
        for u in units:
            for q in range(1, max_q + 1):
                s = q * u * d
                lens = sorted({v for k in range(blocks * s // u + 2) for v in (k * u, k * u + 1) if v <= blocks * s + u})
                for e in (0, 1):
                    for dense in (0, 1):
                        for p in lens:
                            for n in (v for v in lens if v >= 1):
                                for sh in sorted({v for v in lens if v <= min(p, n)} | {min(p, n)}):
                                    yield Params(u=u, q=q, d=d, e=e, dense=dense, p=p, n=n, s_shared=sh)


@attrs.frozen(kw_only=True)
class LinkScope:
    """A named scope of closed-form inputs for the link (optionally with an equal-spec draft group)."""

    name: str
    dcps: tuple[int, ...]
    units: tuple[int, ...]
    max_q: int
    blocks: int  # prompts up to this many attention spans
    draft: bool = False

    def describe(self) -> str:
        """Return the scope in words."""
        return (f"D∈{{{','.join(map(str, self.dcps))}}}, u∈{{{','.join(map(str, self.units))}}}, b≤{self.max_q}u, "
                f"P and N up to {self.blocks} attention span(s), every shared prefix, EAGLE on/off, both retentions"
                + (", with an equal-spec draft group" if self.draft else ""))

    def iterate(self) -> Iterator[Params]:
        """Yield the scope's inputs."""
        return iterate_small_scope(self.dcps, self.units, self.max_q, self.blocks)


LINK_SCOPE = LinkScope(name="link", dcps=(1, 2, 4, 8), units=(1, 2), max_q=2, blocks=1)
LINK_SCOPE_DRAFT = LinkScope(name="link-draft", dcps=(1, 4), units=(1, 2), max_q=2, blocks=1, draft=True)
