"""The parameter space a deployment uses, cut into classes, and one generator of scenarios per class.

A **class** is (DCP size D, interleave I > 1?, PCP > 1?, drafter, group mix) — the axes on which an
engine's arithmetic changes. ``CLASSES`` lists every class the spec accepts; a rule set may refuse some
(SGLang's whole pages and DCP limits) and ``compute_class_scenarios`` says so instead of inventing one.
The generator draws
u up to 1024, per-rank block sizes up to 4096 with several groups, both Mamba retentions, prompts
from a few units up to 10⁶ tokens (as far as the spec's limits allow for the geometry), shared prefixes,
lookups longer than what was stored, and evictions from a single rank.

The same generator serves the committed vectors (``coverage`` suite: ``CASES_PER_CLASS`` seeded cases per
class) and the Hypothesis search of ``conform --adapter`` (the class itself is drawn, so a search shrinks
towards the simplest class that still disagrees). ``classify`` names the class and the boundary classes
(hit 0, hit a multiple of L, hit at a tail boundary, hit inside a block, the checkpoint a multiple of every
Mamba block size, a single-rank eviction, …) of any scenario, for the coverage table of a report.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import attrs

from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel, compute_lcm_span, compute_spans
from kvspec.spec.limits import compute_longest_prompt
from kvspec.spec.rules import check_config, get_rules
from kvspec.spec.scenario import Outcome, Scenario, StoredRequest, compute_stored_objects
from kvspec.spec.types import Rank

DCPS = (1, 2, 3, 4, 8, 16, 32, 64)
# no drafter; an EAGLE-family drafter (EAGLE, EAGLE3, MTP: the drop); the same with its own draft KV group; a drafter
# with its own KV group that takes no drop (DSpark, DFlash)
DRAFTERS = ("none", "eagle", "eagle+draft", "draft-no-drop")
MIXES = ("A", "M", "A+M", "A+A'+M", "A+M+M'")  # attention / Mamba groups; a prime marks a second block size
MAX_UNIT = 1024
MAX_BLOCK = 4096
MAX_TOKENS = 1_000_000
CASES_PER_CLASS = 3
BLOCKS = 256  # at most this many blocks of any group per request: vector files stay small, an answer stays fast
AXES = ("dcp", "interleave", "pcp", "drafter", "mix")


@attrs.frozen(order=True)
class Class:
    """One class of the parameter space: D, whether I > 1, whether PCP > 1, the drafter, the group mix."""

    dcp: int
    interleave: bool
    pcp: bool
    drafter: str
    mix: str

    def label(self) -> str:
        """Return the class as one word-like label (vector case names, reports)."""
        return (f"d{self.dcp}-i{'N' if self.interleave else '1'}-p{'N' if self.pcp else '1'}-{self.drafter}-"
                f"{self.mix.replace('+', '_').replace(chr(39), 'x')}")

    def axis_values(self) -> dict[str, str]:
        """Return the class's value on each axis, as the coverage table prints it."""
        return {"dcp": str(self.dcp), "interleave": "I>1" if self.interleave else "I=1",
                "pcp": "PCP>1" if self.pcp else "PCP=1", "drafter": self.drafter, "mix": self.mix}


def is_class_valid(c: Class) -> bool:
    """Return whether the spec's geometry rules admit the class (hybrids: PCP = 1, and I = 1 under DCP > 1)."""
    hybrid = c.mix not in ("A", "M")
    if c.mix == "M" and c.drafter != "none":
        return False
    return not (hybrid and (c.pcp or (c.interleave and c.dcp > 1)))


CLASSES: tuple[Class, ...] = tuple(c for c in itertools.starmap(Class, itertools.product(
    DCPS, (False, True), (False, True), DRAFTERS, MIXES)) if is_class_valid(c))


class Draw(Protocol):
    """Where the generator's choices come from: a seeded random.Random, or Hypothesis (so failures shrink)."""

    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[Any]) -> Any: ...


@attrs.define
class RandomDraw:
    """Draw from a seeded random.Random (the committed vectors)."""

    rng: random.Random

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]


@attrs.define
class HypothesisDraw:
    """Draw from Hypothesis inside a composite strategy (the adapter search; shrinks towards the first option)."""

    draw: Callable[[Any], Any]

    def integer(self, lo: int, hi: int) -> int:
        from hypothesis import strategies as st
        return int(self.draw(st.integers(lo, hi)))

    def choice(self, options: Sequence[Any]) -> Any:
        from hypothesis import strategies as st
        return self.draw(st.sampled_from(list(options)))


def _multiple(d: Draw, step: int, top: int, large: bool = False) -> int:
    """Return a multiple of step in [step, top] (top >= step), small ones more likely (large: at least top/4)."""
    q_top = top // step
    if large:
        return step * d.integer(max(1, q_top // 4), max(1, q_top))
    return step * d.choice([1, 1, 2, 3, 4, min(8, q_top), d.integer(1, q_top)]) if q_top > 1 else step


def draw_geometry(d: Draw, c: Class, rules: str, large: bool = False) -> Geometry | None:
    """Return a geometry of class c that the rule set accepts, or None when the class has none under it
    (large: block sizes of at least 1024 tokens, so that long prompts stay within BLOCKS blocks)."""
    lone = c.mix in ("A", "M") and c.drafter not in ("eagle+draft", "draft-no-drop")
    for attempt in range(2):
        u = d.choice([1, 2, 4, 8, 16, 64, 128, 256, 1024, d.integer(1, MAX_UNIT)])
        il = d.choice([2, 4, 8, 16]) if c.interleave else 1
        step_a = math.lcm(u, il)
        if step_a > MAX_BLOCK:
            u, step_a = 1, il
        b_a = _multiple(d, step_a, MAX_BLOCK, large)
        b_m = _multiple(d, u, MAX_BLOCK, large)
        groups: list[Group] = []
        if c.mix != "M":
            groups.append(Group(kind="attention", block_size=b_a, eagle=c.drafter == "eagle"))
        if c.drafter in ("eagle+draft", "draft-no-drop"):
            groups.append(Group(kind="attention", block_size=b_a, eagle=c.drafter == "eagle+draft"))
        if c.mix == "A+A'+M":
            groups.append(Group(kind="attention", block_size=_other(d, b_a, step_a), eagle=False))
        if "M" in c.mix:
            groups.append(Group(kind="mamba", block_size=b_m))
        if c.mix == "A+M+M'":
            groups.append(Group(kind="mamba", block_size=_other(d, b_m, u)))
        if attempt == 1 and lone:  # an engine that wants u = the span of a lone group (vLLM): give it that
            span = groups[0].block_size * (c.dcp if groups[0].kind == "attention" else 1)
            u = span
        try:
            g = Geometry(unit=u, groups=tuple(groups), retention=d.choice(["replay", "dense"]),
                         parallel=Parallel(dcp=c.dcp, interleave=il, pcp=d.choice([2, 4]) if c.pcp else 1))
            check_config(get_rules(rules), g)
            return g
        except SpecError:
            continue
    return None


def _other(d: Draw, b: int, step: int) -> int:
    """Return a block size that is a multiple of step and differs from b."""
    for _ in range(4):
        x = _multiple(d, step, MAX_BLOCK)
        if x != b:
            return x
    return b + step if b + step <= MAX_BLOCK else max(step, b - step)


def _near(d: Draw, g: Geometry, top: int) -> int:
    """Return a length in [1, top] near a point where the rules change: a multiple of L, of a span, of every
    Mamba block size (a checkpoint there), or anywhere."""
    u, lcm, spans = g.unit, compute_lcm_span(g), compute_spans(g)
    mamba = [gr.block_size for gr in g.groups if gr.kind == "mamba"]
    base = d.choice([lcm, lcm, d.choice(spans), math.lcm(*mamba) if mamba else lcm, u])
    k = d.integer(1, max(1, top // base)) if top >= base else 0
    delta = d.choice([0, 0, -u, u, -1, 1, 2 * u, d.integer(-3 * u, 3 * u)])
    return max(1, min(top, k * base + delta)) if k else d.integer(1, max(1, top))


def draw_scenario(d: Draw, c: Class, rules: str, shape: int | None = None) -> Scenario | None:
    """Return a scenario of class c under the rule set (None when the class has no geometry there).

    Shapes: 0 a resend of a short prompt; 1 a long prompt (up to 10⁶ tokens or the spec's limit) shared in
    part; 2 two stored requests, a longer lookup and an eviction from one rank (or every rank)."""
    shape = d.integer(0, 2) if shape is None else shape
    g = draw_geometry(d, c, rules, large=shape == 1)
    if g is None:
        return None
    u, lcm, dcp = g.unit, compute_lcm_span(g), g.parallel.dcp
    spans = compute_spans(g)
    cap = min(compute_longest_prompt(dcp, spans, 2, 4 * dcp), BLOCKS * min(spans), MAX_TOKENS) - 2 * u
    if cap < 1:
        return None
    small = max(1, min(cap, 4 * lcm + 2 * u))
    if shape == 0:
        p = _near(d, g, small)
        return Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules=rules)
    if shape == 1:
        n = _near(d, g, max(1, cap))
        shared = d.choice([n, n, _near(d, g, n)])
        return Scenario(geometry=g, prompt=n, stored=(StoredRequest(prompt=n, shared=min(shared, n)),), rules=rules)
    p1 = _near(d, g, small)
    n = min(cap, p1 + d.choice([0, u, lcm, d.integer(1, 2 * lcm)]))
    p2 = _near(d, g, small)
    stored = (StoredRequest(prompt=p1, shared=min(p1, n)),
              StoredRequest(prompt=p2, shared=min(_near(d, g, p2), p2, n)))
    sc = Scenario(geometry=g, prompt=n, stored=stored, rules=rules)
    objs = sorted(compute_stored_objects(sc))
    if objs:
        x, t, r = objs[d.integer(0, len(objs) - 1)]
        picks = {(x, t, r)} if d.choice([True, True, False]) else {(x, t, Rank(rr)) for rr in range(dcp)}
        sc = attrs.evolve(sc, evicted=frozenset(picks))
    return sc


def compute_class_scenarios(c: Class, rules: str, count: int = CASES_PER_CLASS) -> list[Scenario]:
    """Return the seeded scenarios of one class under a rule set (shapes 0, 1, 2, …; [] when it has none)."""
    out = []
    for k in range(count):
        rng = random.Random(f"{rules}/{c.label()}/{k}")
        sc = draw_scenario(RandomDraw(rng), c, rules, shape=k % 3)
        if sc is not None:
            out.append(sc)
    return out


def iterate_coverage(rules: str) -> Iterator[tuple[str, Scenario]]:
    """Yield (case name, scenario) of the coverage suite of a rule set: every class, CASES_PER_CLASS each."""
    for c in CLASSES:
        for k, sc in enumerate(compute_class_scenarios(c, rules)):
            yield f"{c.label()}-{k}", sc


def classify(sc: Scenario) -> Class:
    """Return the class of a scenario's geometry."""
    g = sc.geometry
    att = [gr for gr in g.groups if gr.kind == "attention"]
    mam = [gr for gr in g.groups if gr.kind == "mamba"]
    sizes = sorted({gr.block_size for gr in att})
    draft = any(sum(1 for h in att if h.block_size == b) > 1 for b in sizes)
    eagle = any(gr.eagle for gr in att)
    drafter = ("eagle+draft" if eagle else "draft-no-drop") if draft else ("eagle" if eagle else "none")
    mix = "+".join(([("A" if len(sizes) == 1 else "A+A'")] if att else [])
                   + ([("M" if len({gr.block_size for gr in mam}) == 1 else "M+M'")] if mam else []))
    mix = {"A+A'+M+M'": "A+A'+M"}.get(mix, mix)
    return Class(dcp=g.parallel.dcp, interleave=g.parallel.interleave > 1, pcp=g.parallel.pcp > 1, drafter=drafter,
                 mix=mix)


def compute_boundary_classes(sc: Scenario, outcome: Outcome) -> tuple[str, ...]:
    """Return the boundary classes a scenario's outcome falls in (where the rules change)."""
    g, h = sc.geometry, outcome.hit_length
    lcm, u = compute_lcm_span(g), g.unit
    out = []
    if h == 0:
        out.append("hit 0")
    elif h % lcm == 0:
        out.append("hit a multiple of L")
    else:
        out.append("hit inside a block")
    if h and any(int(t) == int(h) for _, t in outcome.tails):
        out.append("hit at a tail key")
    if h and any(int(t) != int(h) for _, t in outcome.tails):
        out.append("tail key past the hit")
    mamba = [gr.block_size for gr in g.groups if gr.kind == "mamba"]
    if mamba and h and h % math.lcm(*mamba) == 0:
        out.append("hit a multiple of every Mamba block")
    if mamba and len(set(mamba)) > 1 and h and any(h % b == 0 for b in mamba) and h % math.lcm(*mamba):
        out.append("hit a multiple of some Mamba blocks only")
    if any(r.shared < min(r.prompt, sc.prompt) for r in sc.stored):
        out.append("shared prefix")
    if sc.stored and sc.prompt > max(r.prompt for r in sc.stored):
        out.append("lookup longer than stored")
    ranks: dict[tuple[int, int], set[int]] = {(x, t): set() for x, t, _ in sc.evicted}
    for x, t, r in sc.evicted:
        ranks[(x, t)].add(r)
    if any(len(rs) < g.parallel.dcp for rs in ranks.values()):
        out.append("evicted on one rank")
    if ranks and any(len(rs) == g.parallel.dcp for rs in ranks.values()):
        out.append("evicted on every rank")
    n = sc.prompt
    out.append("N <= 4096" if n <= 4096 else "N <= 131072" if n <= 131072 else "N > 131072")
    if u >= 256:
        out.append("u >= 256")
    return tuple(out)
