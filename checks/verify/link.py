"""The link between the Z3 closed form and the executable spec: equal on every checked input."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import attrs

from kvspec.checks.verify.closed_form import (
    VLLM,
    ClosedForm,
    Gone,
    Params,
    StateSet,
    compute_closed_best,
    compute_closed_form,
    compute_closed_safe,
    compute_scaled,
)
from kvspec.spec.failure import compute_safe_boundary
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.invariants import MISSING, compute_failure_witness
from kvspec.spec.lookup import compute_best_hit, compute_physical_best, compute_tail_block
from kvspec.spec.ops import IntOps
from kvspec.spec.rules import PR53324, compute_lookahead, compute_rule_geometry, get_rules
from kvspec.spec.scenario import Outcome, Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule, describe_schedule
from kvspec.spec.store import compute_rule_store
from kvspec.spec.types import GroupId, Tokens


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


def build_scenario(x: Params, draft: bool = False, rule: str = PR53324) -> Scenario:
    """Return the executable scenario the closed form describes (with an equal-spec draft group if asked)."""
    g = build_geometry(x.u, x.q, x.d, x.e, x.dense, draft)
    return Scenario(geometry=g, prompt=x.n, stored=(StoredRequest(prompt=x.p, shared=x.s_shared),), rules=rule)


@functools.lru_cache(maxsize=1)  # a link pass compares one input's lookup and failure closure in turn
def compute_pair(x: Params, draft: bool, rule: str) -> tuple[ClosedForm, Scenario, Outcome]:
    """Return the closed form of an input and the spec's evaluation of the scenario it describes."""
    sc = build_scenario(x, draft, rule)
    return compute_closed_form(IntOps, x, rule)[0], sc, evaluate_scenario(sc)


def compare(x: Params, draft: bool = False, rule: str = PR53324) -> str | None:
    """Return a description of the first difference between closed form and spec (under a rule set), or None."""
    return compare_outcome(x, draft, *compute_pair(x, draft, rule))


def compute_stored_states(x: Params, sc: Scenario, schedule: Schedule) -> frozenset[int]:
    """Return the Mamba states (units) the stored request stored under its rule set and schedule (visible or not)."""
    mamba = GroupId(len(sc.geometry.groups) - 1)
    stored = compute_rule_store(sc.rules, sc.geometry, Tokens(x.p), schedule)
    return frozenset(t // x.u for g, t in stored if g == mamba)


def compare_schedule(x: Params, schedule: Schedule, draft: bool = False, rule: str = VLLM) -> str | None:
    """Return the first difference between the closed form over the Mamba states a schedule left and the spec under
    that schedule, or None: the states lie where the any-schedule theorems assume (Mamba block ends with a hash, or
    C), C is among them when 0 < C <= the last hashed boundary (RESEND's precondition: every derived schedule stops
    at C), and the hit and tails agree."""
    sc = attrs.evolve(build_scenario(x, draft, rule), schedule=schedule)
    out = evaluate_scenario(sc)
    if out.error is not None:
        return f"spec error {out.error} under {describe_schedule(schedule)}"
    states = compute_stored_states(x, sc, schedule)
    block = compute_closed_form(IntOps, x, rule)[0]
    ck, hashed = block.checkpoint, block.hashed
    odd = sorted(t for t in states if not ((t % x.q == 0 and 1 <= t <= hashed) or (ck > 0 and t == ck)))
    if odd:
        return f"Mamba states {odd} (units) off the block ends with a hash and C = {ck} for {x} under {schedule}"
    if 0 < ck <= hashed and ck not in states:
        return f"no Mamba state at C = {ck} (units) for {x} under {schedule}"
    xs = attrs.evolve(x, states=StateSet(states))
    diff = compare_outcome(xs, draft, compute_closed_form(IntOps, xs, rule)[0], sc, out)
    return None if diff is None else f"{diff} under {describe_schedule(schedule)}"


def compare_outcome(x: Params, draft: bool, cf: ClosedForm, sc: Scenario, out: Outcome) -> str | None:
    """Return the first difference between a closed form and the spec's outcome of the scenario it describes."""
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


def compare_failure(x: Params, rule: str = PR53324) -> str | None:
    """Return the first load result whose closed-form safe boundary differs from spec/failure.py's (under a rule
    set), or None.

    Every first failed attention block f (or none) with the Mamba block loaded or not.
    """
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


def compare_best(x: Params, rule: str = PR53324) -> str | None:
    """Return the first difference between the closed form's best and spec/lookup.py's, or None: MAX-HIT's best
    (compute_best_hit) of E and of E minus each one stored object, and BEST's (compute_physical_best) of E."""
    cf, sc, out = compute_pair(x, False, rule)
    if out.error is not None:
        return f"spec error {out.error}"
    rs = get_rules(rule)
    g, lam = compute_rule_geometry(rs, sc.geometry), compute_lookahead(rs, sc.geometry)
    _, att_has, mam_has = compute_closed_form(IntOps, x, rule)
    cases: list[tuple[Any, Any, Gone | None]] = [(compute_physical_best, out.present, None),
                                                 (compute_best_hit, out.present, None)]
    cases += [(compute_best_hit, out.present - {obj}, (min(obj[0], 1), obj[1] // x.u)) for obj in sorted(out.present)]
    for best, present, gone in cases:
        want = best(g, present, Tokens(x.n), lam)
        got = x.u * compute_closed_best(cf, att_has, mam_has, physical=best is compute_physical_best, gone=gone)
        if got != want:
            return f"spec {best.__name__} {want} but closed form {got} (evicted {gone}) for {x}"
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
    schedules: tuple[Schedule, ...] = ()  # each input under each of these schedules (the any-schedule link)

    def describe(self) -> str:
        """Return the scope in words."""
        return (f"D∈{{{','.join(map(str, self.dcps))}}}, u∈{{{','.join(map(str, self.units))}}}, b≤{self.max_q}u, "
                f"P and N up to {self.blocks} attention span(s), every shared prefix, EAGLE on/off, both retentions"
                + (", with an equal-spec draft group" if self.draft else "")
                + (f", under each of {len(self.schedules)} chunk schedules (budgets "
                   f"{', '.join(str(s.budget) for s in self.schedules)}; prefill checkpoint blocks, kvspec's stop_every)"
                   if self.schedules else ""))

    def iterate(self) -> Iterator[Params]:
        """Yield the scope's inputs."""
        return iterate_small_scope(self.dcps, self.units, self.max_q, self.blocks)


LINK_SCOPE = LinkScope(name="link", dcps=(1, 2, 4, 8), units=(1, 2), max_q=2, blocks=1)
# the efficiency theorems' best, with every one-object eviction: a D that is not a power of two, smaller than LINK_SCOPE
LINK_SCOPE_BEST = LinkScope(name="link-best", dcps=(1, 2, 3), units=(1, 2), max_q=2, blocks=1)
LINK_SCOPE_DRAFT = LinkScope(name="link-draft", dcps=(1, 4), units=(1, 2), max_q=2, blocks=1, draft=True)

# the any-schedule link: budgets from one token to a few scheduler blocks, prefill checkpoint blocks, kvspec's proposal
LINK_SCHEDULES = (BLOCK_SCHEDULE, *(Schedule(budget=b) for b in (1, 2, 3, 5, 8, 24)), Schedule(budget=3, checkpoint_alignment=1),
                  Schedule(budget=24, checkpoint_alignment=1), Schedule(budget=24, stop_every=4))
LINK_SCOPE_SCHEDULES = LinkScope(name="link-schedules", dcps=(1, 2, 4), units=(1, 2), max_q=2, blocks=1,
                                 schedules=LINK_SCHEDULES)
