"""The store rule: which objects each group writes for one request, under which boundary.

An object is (group, boundary t); its key is H_t of the writing request's chain, written by
every DCP rank under its own rank fields.  A second put of an existing key keeps the first
value (write-once), so the set of stored objects is the union over requests.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from .boundaries import (
    Boundaries,
    Objects,
    compute_at_most,
    compute_intersection,
    compute_union,
    compute_without,
    has_boundary,
    iterate_boundaries,
    list_objects,
    make_boundaries,
    make_objects,
    make_run,
)
from .geometry import (
    Geometry,
    compute_alignment,
    compute_group_ids,
    compute_lcm_span,
    compute_ranks,
    compute_span,
    has_eagle,
    is_eagle_spec,
    is_fine,
)
from .rules import STORE_SGLANG, STORE_VLLM_0_33, RuleSet, compute_lookahead, compute_rule_geometry
from .schedule import (
    BLOCK_SCHEDULE,
    Schedule,
    compute_checkpoint_position,
    compute_mamba_state_set,
    compute_pinned,
    is_partial,
)
from .types import Boundary, GroupId, Rank, Tokens

Obj = tuple[GroupId, Boundary]  # a (group, boundary) object, all ranks
RankObj = tuple[GroupId, Boundary, Rank]  # one rank's shard of an object


def compute_full_boundary(geometry: Geometry, prompt: Tokens) -> Tokens:
    """Return floor(P/L)*L, the length the positional save covers."""
    lcm = compute_lcm_span(geometry)
    return Tokens(prompt // lcm * lcm)


def compute_sub_block_tail(geometry: Geometry, prompt: Tokens) -> Tokens:
    """Return T = floor(P/u)*u - e*u, the sub-block tail boundary (may be <= 0)."""
    u = geometry.unit
    return Tokens(prompt // u * u - (u if has_eagle(geometry) else 0))


def is_tail_stored(geometry: Geometry, prompt: Tokens) -> bool:
    """Return whether the sub-block tail is stored: fine hits, T > 0, T not a multiple of some Mamba b."""
    t = compute_sub_block_tail(geometry, prompt)
    return is_fine(geometry) and t > 0 and any(
        t % geometry.groups[g].block_size != 0 for g in compute_group_ids(geometry, "mamba"))


def compute_replay_boundary(geometry: Geometry, group: GroupId, prompt: Tokens) -> Tokens:
    """Return R = floor((P-1)/b)*b for a Mamba group (0 when P <= b)."""
    b = geometry.groups[group].block_size
    return Tokens(max(prompt - 1, 0) // b * b)


def compute_span_run(geometry: Geometry, group: GroupId, end: int) -> Boundaries:
    """Return {k·s : 1 <= k <= ⌊end/s⌋}, s the group's span: its whole spans up to `end`."""
    return make_run(compute_span(geometry, group), end)


def compute_attention_set(geometry: Geometry, group: GroupId, prompt: Tokens) -> Boundaries:
    """Return the boundaries an attention group stores for a prompt of P tokens: its whole spans up to ⌊P/L⌋·L and,
    when the tail is stored, each block end of T's block range capped at T."""
    s = compute_span(geometry, group)
    full = compute_full_boundary(geometry, prompt)
    if not is_tail_stored(geometry, prompt):
        return make_run(s, full)
    t = compute_sub_block_tail(geometry, prompt)  # T's block ends below T continue the run of whole spans
    return make_boundaries([t], make_run(s, max(full, (-(-t // s) - 1) * s)).runs)


def compute_mamba_set(geometry: Geometry, group: GroupId, prompt: Tokens) -> Boundaries:
    """Return the boundaries a Mamba group stores: checkpoints by retention, plus the tail T when it is its own."""
    b = geometry.groups[group].block_size
    r = compute_replay_boundary(geometry, group, prompt)
    dense = geometry.retention == "dense"
    points = [] if dense or r <= 0 else [r]
    t = compute_sub_block_tail(geometry, prompt)
    if is_tail_stored(geometry, prompt) and t % b != 0:
        points.append(t)
    return make_boundaries(points, make_run(b, r).runs if dense else ())


def compute_attention_boundaries(geometry: Geometry, group: GroupId, prompt: Tokens) -> tuple[Boundary, ...]:
    """Return compute_attention_set's boundaries, ascending."""
    return tuple(Boundary(t) for t in iterate_boundaries(compute_attention_set(geometry, group, prompt)))


def compute_mamba_boundaries(geometry: Geometry, group: GroupId, prompt: Tokens) -> tuple[Boundary, ...]:
    """Return compute_mamba_set's boundaries, ascending."""
    return tuple(Boundary(t) for t in iterate_boundaries(compute_mamba_set(geometry, group, prompt)))


def compute_store_objects(geometry: Geometry, prompt: Tokens) -> Objects:
    """Return every (group, boundary) object one request of P prompt tokens stores (PR #53324's store rule)."""
    return make_objects({GroupId(gid): (compute_attention_set if g.kind == "attention" else compute_mamba_set)(
        geometry, GroupId(gid), prompt) for gid, g in enumerate(geometry.groups)})


@functools.lru_cache(maxsize=65536)  # pure over frozen values: memoized for exhaustive runs
def compute_store_boundaries(geometry: Geometry, prompt: Tokens) -> frozenset[Obj]:
    """Return compute_store_objects' objects as an explicit set."""
    return list_objects(compute_store_objects(geometry, prompt))


def compute_rank_objects(geometry: Geometry, objects: Iterable[Obj]) -> frozenset[RankObj]:
    """Return every rank's shard of the objects (each rank writes its own key)."""
    return frozenset((g, t, r) for g, t in objects for r in compute_ranks(geometry))


@functools.lru_cache(maxsize=256)  # pure: the scenarios of one stored request share it (each eviction, each lookup)
def compute_visible(objects: frozenset[Obj], shared: Tokens, lookahead: int = 0) -> frozenset[Obj]:
    """Return the objects a lookup request can name: H_t (covering [0, t + λ)) agrees for t + λ <= the shared prefix."""
    return frozenset((g, t) for g, t in objects if t + lookahead <= shared)


def compute_present_after(geometry: Geometry, objects: frozenset[Obj], evicted: Iterable[RankObj]) -> frozenset[Obj]:
    """Return E when every rank wrote every object and the `evicted` shards are gone: objects less those with a lost shard.

    Equal to compute_present over the rank shards (tests/test_spec_invariants.py checks it), without building them.
    """
    ranks = geometry.parallel.dcp
    lost = {(g, t) for g, t, r in evicted if 0 <= r < ranks}
    return objects - lost if lost else objects


def compute_visible_objects(objects: Objects, shared: Tokens, lookahead: int = 0) -> Objects:
    """Return compute_visible on runs and points: each group's boundaries cut to t <= S − λ."""
    return make_objects({g: compute_at_most(b, shared - lookahead) for g, b in objects.groups})


def compute_present_after_objects(geometry: Geometry, objects: Objects, evicted: Iterable[RankObj]) -> Objects:
    """Return compute_present_after on runs and points: an object with a lost shard becomes a hole of its group."""
    lost = {(g, t) for g, t, r in evicted if 0 <= r < geometry.parallel.dcp}
    return make_objects({g: compute_without(b, (t for x, t in lost if x == g)) for g, b in objects.groups})


def compute_present(geometry: Geometry, rank_objects: Iterable[RankObj]) -> frozenset[Obj]:
    """Return E: the objects whose key exists on every rank."""
    ranks = set(compute_ranks(geometry))
    seen: dict[Obj, set[Rank]] = {}
    for g, t, r in rank_objects:
        seen.setdefault((g, t), set()).add(r)
    return frozenset(o for o, rs in seen.items() if rs >= ranks)


# ---------------------------------------------------------------- vLLM 0.33.0's store rule

def compute_hashed_length(geometry: Geometry, prompt: Tokens, lookahead: int = 0) -> Tokens:
    """Return ⌊(P − λ)/u⌋·u, the last boundary with a hash when each hash covers λ tokens past its unit."""
    u = geometry.unit
    return Tokens(max(prompt - lookahead, 0) // u * u)


def compute_checkpoint(geometry: Geometry, prompt: Tokens, lookahead: int = 0) -> Tokens:
    """Return C = max(⌊P/a⌋·a − a, 0) with EAGLE, else max(⌊(P − max(1, λ))/a⌋·a, 0): the prompt's Mamba checkpoint."""
    return compute_checkpoint_position(prompt, compute_alignment(geometry), has_eagle(geometry), lookahead)


def compute_proof_margin(geometry: Geometry, group: GroupId) -> Tokens:
    """Return the EAGLE proof margin of an attention group: u when fine and s > u, else s; 0 outside an EAGLE spec group."""
    if geometry.groups[group].kind != "attention" or not is_eagle_spec(geometry, group):
        return Tokens(0)
    s, u = compute_span(geometry, group), geometry.unit
    return Tokens(u if is_partial(geometry) and s > u else s)


def compute_replay_states(geometry: Geometry, group: GroupId, prompt: Tokens,
                          pinned: tuple[tuple[int, int], ...] = ()) -> tuple[Boundary, ...]:
    """Return the Mamba states replay retention keeps: each replay boundary aligned down to a, then to b (> 0 only);
    and a state a traced chunk left at e when the junction J pinned while it ran (or J − b, when the group's own
    spec group takes the EAGLE drop) aligns to e the same way (`pinned`: (e, J) pairs)."""
    a, lcm, b = compute_alignment(geometry), compute_lcm_span(geometry), geometry.groups[group].block_size
    points: tuple[int, ...]
    if has_eagle(geometry):
        points = (max((prompt - 1) // lcm * lcm - lcm, 0), max(prompt // lcm * lcm - lcm, 0))
    else:
        points = (max(prompt - 1, 0),)
    out = {Boundary(max(p, 0) // a * a // b * b) for p in points}
    for e, j in pinned:
        marks = (j, j - b) if is_eagle_spec(geometry, group) else (j,)
        if j and any(max(m, 0) // a * a // b * b == e for m in marks):
            out.add(Boundary(e))
    return tuple(sorted(out - {Boundary(0)}))


def compute_store_objects_vllm(geometry: Geometry, prompt: Tokens, lookahead: int = 0,
                               schedule: Schedule = BLOCK_SCHEDULE) -> Objects:
    """Return every (group, boundary) object one request of P tokens stores under vLLM 0.33.0's connector (the
    positional save ends at the last whole L-block with its hashes: ⌊min(⌊P/L⌋·L, hashed)/L⌋·L); a Mamba state only
    where the schedule left one (spec/schedule.py)."""
    hashed, lcm = compute_hashed_length(geometry, prompt, lookahead), compute_lcm_span(geometry)
    full = min(compute_full_boundary(geometry, prompt), hashed // lcm * lcm)
    c = compute_checkpoint(geometry, prompt, lookahead)
    has_c = 0 < c <= hashed
    out: dict[GroupId, Boundaries] = {}
    for gid, g in enumerate(geometry.groups):
        gi = GroupId(gid)
        if g.kind == "attention":
            s = compute_span(geometry, gi)
            end = c + compute_proof_margin(geometry, gi)
            if has_c and is_partial(geometry) and end <= min(prompt, hashed):  # each block end from C's L-block to
                # the end: they continue the run of whole spans (⌊C/L⌋·L <= full), then the end itself
                out[gi] = make_boundaries([end], compute_span_run(geometry, gi, max(full, (-(-end // s) - 1) * s)).runs)
            else:
                out[gi] = compute_span_run(geometry, gi, full)
            continue
        b = g.block_size
        states = compute_mamba_state_set(schedule, geometry, prompt, lookahead, b, c)
        if geometry.retention == "dense":
            kept = compute_intersection(make_run(b, min(prompt, hashed)), states)
        else:
            kept = make_boundaries(t for t in compute_replay_states(geometry, gi, prompt,
                                                                    compute_pinned(schedule, geometry, prompt, lookahead))
                                   if t <= hashed and has_boundary(states, t))
        if has_c and has_boundary(states, c):
            kept = compute_union(kept, make_boundaries((c,)))
        out[gi] = kept
    return make_objects(out)


@functools.lru_cache(maxsize=65536)  # pure over frozen values: memoized for exhaustive runs
def compute_store_boundaries_vllm(geometry: Geometry, prompt: Tokens, lookahead: int = 0,
                                  schedule: Schedule = BLOCK_SCHEDULE) -> frozenset[Obj]:
    """Return compute_store_objects_vllm's objects as an explicit set."""
    return list_objects(compute_store_objects_vllm(geometry, prompt, lookahead, schedule))


def compute_store_objects_sglang(geometry: Geometry, prompt: Tokens, lookahead: int = 0) -> Objects:
    """Return the objects one request of P tokens stores under SGLang 0.5.23's HiCache L3: the radix tree inserts
    H = ⌊(P − λ)/u⌋·u tokens cut to the smallest Mamba state, E = min(H, ⌊H/b⌋·b over Mamba groups) (0: no state,
    nothing inserted); every whole page (the attention span s) up to E, and a Mamba group's state at E when its own
    state ⌊H/b⌋·b is E (a state past the insert's end is not kept)."""
    hashed = compute_hashed_length(geometry, prompt, lookahead)
    # checkpoint_into_tree inserts the components' smallest length; a Mamba component's is its state's
    end = Tokens(min([hashed, *(hashed // g.block_size * g.block_size for g in geometry.groups if g.kind == "mamba")]))
    return make_objects({GroupId(gid): compute_span_run(geometry, GroupId(gid), end) if g.kind == "attention"
                         else make_boundaries([end] if end and hashed // g.block_size * g.block_size == end else [])
                         for gid, g in enumerate(geometry.groups)})


def compute_store_boundaries_sglang(geometry: Geometry, prompt: Tokens, lookahead: int = 0) -> frozenset[Obj]:
    """Return compute_store_objects_sglang's objects as an explicit set."""
    return list_objects(compute_store_objects_sglang(geometry, prompt, lookahead))


def compute_rule_objects(rules: RuleSet, geometry: Geometry, prompt: Tokens,
                         schedule: Schedule = BLOCK_SCHEDULE) -> Objects:
    """Return the objects one request of P tokens stores under a rule set's store rule (on its rule geometry), held
    per group as runs and points; the schedule decides which Mamba states exist under a vLLM store rule (the PR's rule
    assumes the block schedule)."""
    if rules.store == STORE_VLLM_0_33:
        return compute_store_objects_vllm(compute_rule_geometry(rules, geometry), prompt,
                                          compute_lookahead(rules, geometry), schedule)
    if rules.store == STORE_SGLANG:
        return compute_store_objects_sglang(geometry, prompt, compute_lookahead(rules, geometry))
    return compute_store_objects(geometry, prompt)


def compute_deferred_objects_vllm(geometry: Geometry, prompt: Tokens, decoded: Tokens, lookahead: int,
                                  schedule: Schedule = BLOCK_SCHEDULE, decode_saves: bool = False,
                                  decode_states: bool = False) -> Objects:
    """Return what a vLLM writer of P prompt tokens stores once it decoded O, beyond what compute_store_objects_vllm
    states for its prefill (some objects may coincide with that), with
    s = P + O − 1 − λ (the last boundary a decode step saw hashed) and L the scheduler block:
    attention: each group's whole spans up to ⌊min(P + O − 1, ⌊(P + O − λ)/u⌋·u)/L⌋·L with decode saves, else (λ > 0:
    0.34.0's finish-time save) up to ⌊min(P, ⌊(P + O − λ)/u⌋·u)/L⌋·L;
    Mamba, kept every r tokens (dense: r = b; replay: none, or r = L with decode saves and decode states, when the
    connector turns retention 0 into the scheduler block): the schedule's prompt states k·r <= ⌊(P − λ)/u⌋·u or
    <= min(P, s), and with decode saves and decode states every k·r in (P, s]."""
    lcm, b_attn = compute_lcm_span(geometry), Tokens(0)
    if decoded and (decode_saves or lookahead):
        reach = prompt + decoded - 1 if decode_saves else prompt
        b_attn = Tokens(min(reach, compute_hashed_length(geometry, Tokens(prompt + decoded), lookahead)) // lcm * lcm)
    hashed, seen = compute_hashed_length(geometry, prompt, lookahead), prompt + decoded - 1 - lookahead
    c = compute_checkpoint(geometry, prompt, lookahead)
    out: dict[GroupId, Boundaries] = {}
    for gid, g in enumerate(geometry.groups):
        if g.kind == "attention":
            out[GroupId(gid)] = compute_span_run(geometry, GroupId(gid), b_attn)
            continue
        b = g.block_size
        every = b if geometry.retention == "dense" else lcm if decode_saves and decode_states else 0
        if not every:
            continue
        every = max(every // b, 1) * b  # one state per segment of `every` tokens: each block at/below b is a boundary
        states = compute_mamba_state_set(schedule, geometry, prompt, lookahead, b, c)
        kept = compute_intersection(make_run(every, max(hashed, min(prompt, seen))), states)
        first, top = (prompt // every + 1) * every, seen // every * every
        if decode_saves and decode_states and top >= first:  # the decode phase's states: a step ends at every token
            kept = compute_union(kept, make_boundaries(runs=((first, every, top),)))
        out[GroupId(gid)] = kept
    return make_objects(out)


def compute_rule_deferred_objects(rules: RuleSet, geometry: Geometry, prompt: Tokens, decoded: Tokens,
                                  schedule: Schedule = BLOCK_SCHEDULE, decode_saves: bool = False) -> Objects:
    """Return what a writer stores past its prefill's save once it decoded O tokens (`decode_saves`: its connector
    saved the decode phase, vLLM's save_decode_cache): compute_deferred_objects_vllm under a vLLM store rule — the
    finish-time save when the rule set has deferred saves, decode-phase Mamba states when it has decode states —
    else nothing."""
    if rules.store != STORE_VLLM_0_33 or not (decode_saves or (decoded and rules.deferred_saves)):
        return make_objects({})
    return compute_deferred_objects_vllm(compute_rule_geometry(rules, geometry), prompt, decoded,
                                         compute_lookahead(rules, geometry), schedule, decode_saves, rules.decode_states)


@functools.lru_cache(maxsize=65536)  # pure over frozen values: memoized for exhaustive runs
def compute_rule_deferred(rules: RuleSet, geometry: Geometry, prompt: Tokens, decoded: Tokens,
                          schedule: Schedule = BLOCK_SCHEDULE, decode_saves: bool = False) -> frozenset[Obj]:
    """Return compute_rule_deferred_objects' objects as an explicit set."""
    return list_objects(compute_rule_deferred_objects(rules, geometry, prompt, decoded, schedule, decode_saves))


@functools.lru_cache(maxsize=65536)  # pure over frozen values: memoized for exhaustive runs
def compute_rule_store(rules: RuleSet, geometry: Geometry, prompt: Tokens,
                       schedule: Schedule = BLOCK_SCHEDULE) -> frozenset[Obj]:
    """Return compute_rule_objects' objects as an explicit set."""
    return list_objects(compute_rule_objects(rules, geometry, prompt, schedule))
