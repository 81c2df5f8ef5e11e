"""Bounded exhaustive runs of the whole registry on the executable spec, over small scopes."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import attrs

from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel, compute_lcm_span, compute_span
from kvspec.spec.rules import (
    PR53324,
    VLLM_0_33,
    VLLM_0_34,
    RuleSet,
    check_config,
    coerce_rules,
    compute_lookahead,
)
from kvspec.spec.scenario import Scenario, StoredRequest
from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule
from kvspec.spec.store import compute_rank_objects, compute_rule_store, compute_visible
from kvspec.spec.types import Rank, Tokens

DCPS = (1, 2, 4, 8)
UNITS = (1, 2, 4)
MAX_Q = 4  # block sizes up to 4u


def iterate_geometries(dcps: tuple[int, ...] = DCPS, units: tuple[int, ...] = UNITS,
                       max_q: int = MAX_Q) -> Iterator[Geometry]:
    """Yield every geometry of the scope: attention + Mamba, plus an equal-spec draft or a second Mamba group."""
    return iter(_compute_geometries(dcps, units, max_q))


@functools.lru_cache(maxsize=16)  # one object per geometry: the spec's memo tables then match keys by identity
def _compute_geometries(dcps: tuple[int, ...], units: tuple[int, ...], max_q: int) -> tuple[Geometry, ...]:
    out = []
    for d in dcps:
        for u in units:
            for qa in range(1, max_q + 1):
                for qm in range(1, max_q + 1):
                    for eagle in (False, True):
                        for ret in ("replay", "dense"):
                            att = Group(kind="attention", block_size=qa * u, eagle=eagle)
                            mam = Group(kind="mamba", block_size=qm * u)
                            shapes = [(att, mam), (Group(kind="attention", block_size=qa * u), att, mam)]
                            shapes.append((att, mam, Group(kind="mamba", block_size=(qm % max_q + 1) * u)))
                            out += [Geometry(unit=u, groups=gs, parallel=Parallel(dcp=d), retention=ret)
                                    for gs in shapes]
    return tuple(out)


def compute_lengths(g: Geometry, limit_units: int) -> list[int]:
    """Return the prompt and prefix lengths of the scope: a few units, and one unit around every span multiple."""
    u = g.unit
    spans = {compute_span(g, i) for i in range(len(g.groups))} | {compute_lcm_span(g)}
    near = {k * s + du * u for s in spans for k in (1, 2) for du in (-1, 0, 1)}
    small = {k * u for k in range(limit_units + 1)}
    vals = {v + dv for v in near | small for dv in (0, 1)}
    return sorted(v for v in vals if 0 <= v <= 2 * compute_lcm_span(g) + 2 * u)


def iterate_scenarios(geometry: Geometry, limit_units: int = 3, evict: bool = True, rules: RuleSet | str = PR53324,
                      schedules: tuple[Schedule, ...] = (BLOCK_SCHEDULE,)) -> Iterator[Scenario]:
    """Yield the scenarios of one geometry under each schedule: prompts near every span boundary, every shared
    prefix, single evictions."""
    for kw in _iterate_arguments(geometry, limit_units, evict, rules, schedules):
        yield Scenario(**kw)


def _iterate_arguments(geometry: Geometry, limit_units: int, evict: bool, rule_set: RuleSet | str,
                       schedules: tuple[Schedule, ...]) -> Iterator[dict[str, Any]]:
    """Yield the Scenario arguments of iterate_scenarios, in its order (a sample builds only the scenarios it keeps)."""
    rules = coerce_rules(rule_set)  # once, not in every Scenario's converter
    try:  # a geometry the rule set's engine refuses has no scenario under it (SGLang: whole pages, DCP limits)
        check_config(rules, geometry)
    except SpecError:
        return
    lens = compute_lengths(geometry, limit_units)
    u = geometry.unit
    for schedule in schedules:
        base: dict[str, Any] = {"geometry": geometry, "rules": rules}
        if schedule != BLOCK_SCHEDULE:
            base["schedule"] = schedule
        for p in lens:
            if p >= 1:  # an identical resend, every shared prefix of the scope
                for s in sorted({t for t in lens if t <= p and t % u == 0} | {p}):
                    yield {**base, "prompt": p, "stored": (StoredRequest(prompt=p, shared=s),)}
            # a longer lookup sharing the whole stored prompt (and one unit more than it could share)
            yield {**base, "prompt": p + u, "stored": (StoredRequest(prompt=p, shared=p),)}
            if evict and p >= 1:
                objs = compute_visible(compute_rule_store(rules, geometry, Tokens(p), schedule), Tokens(p),
                                       compute_lookahead(rules, geometry))
                last = Rank(geometry.parallel.dcp - 1)
                for g, t in sorted(objs):
                    yield {**base, "prompt": p, "stored": (StoredRequest(prompt=p, shared=p),),
                           "evicted": frozenset({(g, t, last)})}
                if len(objs) > 1:  # an object evicted on every rank
                    g, t = sorted(objs)[len(objs) // 2]
                    yield {**base, "prompt": p, "stored": (StoredRequest(prompt=p, shared=p),),
                           "evicted": compute_rank_objects(geometry, {(g, t)})}
            # two stored requests: the lookup shares a prefix with each
            if p >= 2 * u:
                yield {**base, "prompt": p + u, "stored": (StoredRequest(prompt=p, shared=p - u),
                                                           StoredRequest(prompt=p + 2 * u, shared=p + u))}


def iterate_all(limit_units: int = 3, evict: bool = True, stride: int = 1, offset: int = 0,
                dcps: tuple[int, ...] = DCPS, rules: str = PR53324, units: tuple[int, ...] = UNITS,
                max_q: int = MAX_Q, schedules: tuple[Schedule, ...] = (BLOCK_SCHEDULE,),
                every: int = 1) -> Iterator[Scenario]:
    """Yield every `every`-th scenario of the scope (geometries offset, offset+stride, ... for parallel workers)."""
    k = 0
    for j, g in enumerate(iterate_geometries(dcps, units, max_q)):
        if j % stride == offset:
            for kw in _iterate_arguments(g, limit_units, evict, rules, schedules):
                if k % every == 0:
                    yield Scenario(**kw)
                k += 1


def _set(xs: tuple[int, ...]) -> str:
    return "{" + ",".join(map(str, xs)) + "}"


@attrs.frozen(kw_only=True)
class Scope:
    """A named bounded scope of scenarios: the geometries, prompts, prefixes and evictions a run visits."""

    name: str
    dcps: tuple[int, ...] = DCPS
    units: tuple[int, ...] = UNITS
    max_q: int = MAX_Q  # block sizes up to max_q·u
    limit_units: int = 3  # prompts of up to this many units, besides those near every span multiple
    evict: bool = True  # single-shard and all-rank evictions of every stored object
    rules: str = PR53324
    schedules: tuple[Schedule, ...] = (BLOCK_SCHEDULE,)  # how the stored requests were scheduled (spec/schedule.py)
    fast_every: int = 40  # `verify --fast` visits one geometry in this many

    def describe(self) -> str:
        """Return the scope in words (the verify table's statements quote it)."""
        ev = "single-shard and all-rank evictions, " if self.evict else ""
        budgets = tuple(sorted({s.budget for s in self.schedules if s.budget}))
        sched = "" if self.schedules == (BLOCK_SCHEDULE,) else \
            f"; stored prefills scheduled under chunk budgets {_set(budgets)} (prefill checkpoint blocks on some)"
        return (f"D∈{_set(self.dcps)}, u∈{_set(self.units)}, b≤{self.max_q}u, attention + Mamba (+ an equal-spec draft "
                f"group or a second Mamba size), EAGLE on/off, both retentions, prompts near every span boundary and "
                f"up to {self.limit_units} units, every shared prefix, {ev}two stored requests; rules {self.rules}{sched}")

    def iterate(self, stride: int = 1, offset: int = 0) -> Iterator[Scenario]:
        """Yield the scope's scenarios (geometries offset, offset+stride, ...)."""
        return iterate_all(self.limit_units, self.evict, stride, offset, self.dcps, self.rules, self.units, self.max_q,
                           self.schedules)

    def sample(self, part: int, parts: int, every: int = 1) -> Iterator[Geometry]:
        """Yield the part-th of each `parts` consecutive geometries of the sample that keeps one in `every` (geometries
        0, every, 2·every, … dealt to the parts in turn): the geometries one of a check's parallel parts visits."""
        for k, g in enumerate(iterate_geometries(self.dcps, self.units, self.max_q)):
            if k % every == 0 and (k // every) % parts == part:
                yield g

    def scenarios(self, geometry: Geometry) -> Iterator[Scenario]:
        """Yield the scope's scenarios of one of its geometries."""
        return iterate_scenarios(geometry, self.limit_units, self.evict, self.rules, self.schedules)

    def same_but_rules(self, other: Scope) -> bool:
        """Return whether the two scopes visit the same scenarios, under their own rule sets."""
        return attrs.evolve(other, name=self.name, rules=self.rules) == self


SCOPE_SMALL = Scope(name="small")  # EXHAUSTIVE: the registry under the PR's rules


def compute_registry_scope(rules: str) -> Scope:
    """Return the small scope under a rule set (EXHAUSTIVE's row of it; a rule set's engine refusing a geometry
    leaves it no scenario there)."""
    return SCOPE_SMALL if rules == SCOPE_SMALL.rules else attrs.evolve(SCOPE_SMALL, name=f"small@{rules}", rules=rules)


# the registry when the stored prefill ran under a chunk budget (spec/schedule.py): budgets from one token to a few
# scheduler blocks, prefill checkpoint blocks on two of them (the block schedule is the small scope's)
SCHEDULES = (*(Schedule(budget=b) for b in (1, 2, 3, 8, 24)),
             Schedule(budget=3, checkpoint_alignment=1), Schedule(budget=24, checkpoint_alignment=1))
SCOPE_SCHEDULES_VLLM = Scope(name="schedules-vllm", rules=VLLM_0_33, dcps=(1, 8), units=(1, 2), max_q=3,
                             schedules=SCHEDULES)
SCOPE_SCHEDULES_0_34 = attrs.evolve(SCOPE_SCHEDULES_VLLM, name="schedules-0.34", rules=VLLM_0_34)
SCOPE_FAILURE = Scope(name="failure", dcps=(1, 2, 4), units=(1, 2), max_q=3, evict=False)  # the failure closure
SCOPE_MUTANTS = Scope(name="mutant-hunt", dcps=(2, 8, 4, 1))  # mutants: the DCP cases first, they catch soonest
