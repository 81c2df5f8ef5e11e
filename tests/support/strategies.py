"""Hypothesis strategies that construct valid values from the spec's preconditions (no filtering)."""

from __future__ import annotations

from hypothesis import strategies as st

from kvspec.spec.geometry import Geometry, Group, Parallel, compute_lcm_span, compute_span
from kvspec.spec.limits import MAX_CHUNK_ENDS, compute_longest_prompt
from kvspec.spec.rules import STORE_VLLM_0_33, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest
from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule, compute_scheduler_block
from kvspec.spec.store import compute_rank_objects, compute_rule_store, compute_visible

DCPS = (1, 2, 4, 8, 16)
SAFE_RULES = ("pr53324", "vllm-0.33.0")  # the rule sets every safety invariant holds for


@st.composite
def geometries(draw: st.DrawFn, max_unit: int = 256, max_q: int = 16) -> Geometry:
    """Draw an attention + Mamba geometry, optionally with an equal-spec draft group or a second Mamba group."""
    u = draw(st.integers(1, max_unit))
    d = draw(st.sampled_from(DCPS))
    qa = draw(st.integers(1, max_q))
    qm = draw(st.one_of(st.just(qa), st.integers(1, max_q)))
    eagle = draw(st.booleans())
    groups = [Group(kind="attention", block_size=qa * u, eagle=eagle), Group(kind="mamba", block_size=qm * u)]
    extra = draw(st.sampled_from(["none", "draft", "mamba2"]))
    if extra == "draft":
        groups.insert(1, Group(kind="attention", block_size=qa * u, eagle=draw(st.booleans())))
    elif extra == "mamba2":
        groups.append(Group(kind="mamba", block_size=draw(st.integers(1, max_q)) * u))
    groups = draw(st.permutations(groups))
    return Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=d),
                    retention=draw(st.sampled_from(["replay", "dense"])))


@st.composite
def schedules(draw: st.DrawFn, g: Geometry, longest: int = 0, requests: int = 1) -> Schedule:
    """Draw the block schedule or a chunk budget (from a quarter of the Mamba block to 4 scheduler blocks), with or
    without prefill checkpoint blocks and a long-prefill threshold; for `requests` prompts of up to `longest` tokens
    the budget is large enough that their chunks stay within spec/limits.py MAX_CHUNK_ENDS (a chunk of c = min(budget,
    threshold) tokens is cut to at least c/2 at a block end, or stops at a block end or one of three positions: at
    most 2·P/c + 6 chunks; the threshold is at least budget/2)."""
    b = compute_scheduler_block(g)
    if b == 0 or draw(st.booleans()):
        return BLOCK_SCHEDULE
    least = -(-4 * longest * requests // (MAX_CHUNK_ENDS - 6 * requests)) + 4 if longest else 1
    budget = draw(st.integers(max(1, b // 4, least), max(4 * compute_lcm_span(g), least)))
    return Schedule(budget=budget, checkpoint_alignment=draw(st.sampled_from([None, None, 1, g.unit])),
                    long_prefill_threshold=draw(st.sampled_from([0, 0, 0, budget // 2])))


@st.composite
def scenarios(draw: st.DrawFn, rules: str | None = None, max_blocks: int = 6, evict: bool = True) -> Scenario:
    """Draw a rule set (unless given), a geometry, 1-3 stored requests sharing random prefixes, random evictions."""
    rules = rules or draw(st.sampled_from(SAFE_RULES))
    g = draw(geometries())
    lcm = compute_lcm_span(g)
    # every prompt within what spec/limits.py accepts for 3 stored requests and 4 evictions
    cap = compute_longest_prompt(g.parallel.dcp, tuple(compute_span(g, i) for i in range(len(g.groups))), 3, 4)
    top = min(10**6, max_blocks * lcm, cap)
    near = st.integers(0, max_blocks).flatmap(
        lambda k: st.integers(max(1, min(k * lcm - 3 * g.unit, cap)), min(k * lcm + 3 * g.unit, cap)))
    n = draw(st.one_of(st.integers(1, top), near))
    stored = []
    for _ in range(draw(st.integers(1, 3))):
        # most stored prompts are the lookup itself or overlap it heavily, so hits happen
        p = draw(st.one_of(st.just(n), st.integers(n, min(n + 2 * lcm, cap)), st.integers(0, top), near))
        s = draw(st.one_of(st.just(min(p, n)), st.just(min(p, n)), st.integers(0, min(p, n))))
        stored.append(StoredRequest(prompt=p, shared=s))
    evicted: frozenset = frozenset()
    if evict:
        objs = set()
        for r in stored:
            objs |= compute_visible(compute_rule_store(get_rules(rules), g, r.prompt), r.shared)
        shards = sorted(compute_rank_objects(g, objs))
        if shards and draw(st.booleans()):
            evicted = frozenset(draw(st.lists(st.sampled_from(shards), max_size=4)))
    schedule = (draw(schedules(g, max(r.prompt for r in stored), len(stored)))
                if get_rules(rules).store == STORE_VLLM_0_33 else BLOCK_SCHEDULE)
    return Scenario(geometry=g, prompt=n, stored=tuple(stored), evicted=evicted, rules=rules, schedule=schedule)


@st.composite
def arbitrary_present_scenarios(draw: st.DrawFn) -> Scenario:
    """Draw a geometry and an arbitrary present set E (any subset of nameable objects)."""
    g = draw(geometries(max_unit=8, max_q=6))
    lcm = compute_lcm_span(g)
    n = draw(st.integers(1, 4 * lcm))
    u = g.unit
    spans = sorted({compute_span(g, i) for i in range(len(g.groups))})
    cands = st.one_of(st.integers(1, n // u).map(lambda k: k * u) if n >= u else st.nothing(),
                      *(st.integers(1, max(n // s, 1)).map(lambda k, s=s: k * s) for s in spans))
    if n < u:
        return Scenario(geometry=g, prompt=n, objects=frozenset())
    objs = draw(st.lists(st.tuples(st.integers(0, len(g.groups) - 1), cands), max_size=30))
    top = n // u * u
    return Scenario(geometry=g, prompt=n, objects=frozenset((a, t) for a, t in objs if t <= top))
