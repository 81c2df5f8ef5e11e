"""The load plan for a cold local cache: which blocks each group loads and under which key."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .boundaries import Objects, compute_group_boundaries, compute_whole_run, has_boundary
from .geometry import Geometry, compute_rank_fields, compute_ranks, compute_span
from .keys import StoreKey, compute_hash_at
from .lookup import compute_tail_block
from .store import Obj
from .types import Boundary, GroupId, Tokens


@attrs.frozen(kw_only=True)
class LoadEntry:
    """One physical block to load: tokens [start, end) count as computed, keyed at key_boundary."""

    group: GroupId
    block: int
    start: Tokens
    end: Tokens
    key_boundary: Boundary
    present: bool


def plan_load(geometry: Geometry, present: frozenset[Obj], hit: Tokens,
              tails: Sequence[tuple[GroupId, Boundary]]) -> tuple[LoadEntry, ...]:
    """Return the blocks to load, group then block order: attention 0..c, Mamba only c; tail keyed at B_g."""
    if hit <= 0:
        return ()
    tail_of = dict(tails)
    out: list[LoadEntry] = []
    for gid, g in enumerate(geometry.groups):
        s = compute_span(geometry, GroupId(gid))
        c = compute_tail_block(s, hit)
        for i in (range(c + 1) if g.kind == "attention" else (c,)):
            end = min((i + 1) * s, hit)
            key = Boundary((i + 1) * s) if end < hit else tail_of[GroupId(gid)]
            out.append(LoadEntry(group=GroupId(gid), block=i, start=Tokens(i * s), end=Tokens(end),
                                 key_boundary=key, present=(gid, key) in present))
    return tuple(out)


@attrs.frozen(kw_only=True)
class LoadRun:
    """A group's blocks to load, first..last, as plan_load lists them: block i covers [i·s, min((i+1)·s, h)) and is
    keyed at (i+1)·s, the last at the tail key; `absent` lists the blocks whose key is not present."""

    group: GroupId
    first: int
    last: int
    span: Tokens
    hit: Tokens
    tail_key: Boundary
    absent: tuple[int, ...] = ()

    def entries(self) -> tuple[LoadEntry, ...]:
        """Return the run as plan_load's entries (cost grows with the blocks)."""
        return tuple(LoadEntry(group=self.group, block=i, start=Tokens(i * self.span),
                               end=Tokens(min((i + 1) * self.span, self.hit)),
                               key_boundary=self.tail_key if i == self.last else Boundary((i + 1) * self.span),
                               present=i not in self.absent) for i in range(self.first, self.last + 1))


def plan_load_runs(geometry: Geometry, present: Objects, hit: Tokens,
                   tails: Sequence[tuple[GroupId, Boundary]]) -> tuple[LoadRun, ...]:
    """Return plan_load's plan as one run per group (attention blocks 0..c, Mamba block c), from E as runs and points:
    the whole spans present from the start are read off the runs, only blocks past them are tested one by one."""
    if hit <= 0:
        return ()
    tail_of = dict(tails)
    out = []
    for gid, g in enumerate(geometry.groups):
        group = GroupId(gid)
        s = compute_span(geometry, group)
        c = compute_tail_block(s, hit)
        first = 0 if g.kind == "attention" else c
        have = compute_group_boundaries(present, group)
        absent = [i for i in range(max(first, compute_whole_run(have, s)), c) if not has_boundary(have, (i + 1) * s)]
        tail = tail_of[group]
        if not has_boundary(have, tail):
            absent.append(c)
        out.append(LoadRun(group=group, first=first, last=c, span=s, hit=hit, tail_key=tail, absent=tuple(absent)))
    return tuple(out)


def plan_load_keys(geometry: Geometry, plan: Sequence[LoadEntry], chain: Sequence[bytes], model: str,
                   cache_prefix: str = "") -> tuple[tuple[int, StoreKey], ...]:
    """Return (rank, key) for every rank's shard of every planned block, in plan then rank order."""
    out = []
    for e in plan:
        h = compute_hash_at(chain, geometry.unit, e.key_boundary).hex()
        for r in compute_ranks(geometry):
            f = compute_rank_fields(geometry, r)
            out.append((int(r), StoreKey(model=model, tp_rank=f.tp_rank, pcp_rank=f.pcp_rank,
                                         dcp_rank=f.dcp_rank, pp_rank=f.pp_rank, group=e.group,
                                         hash_hex=h, cache_prefix=cache_prefix)))
    return tuple(out)


def plan_store_keys(geometry: Geometry, objects: Sequence[Obj], chain: Sequence[bytes], model: str,
                    cache_prefix: str = "") -> tuple[tuple[int, StoreKey], ...]:
    """Return (rank, key) for every rank's shard of every object, in (group, boundary) then rank order."""
    out = []
    for g, t in sorted(objects):
        h = compute_hash_at(chain, geometry.unit, t).hex()
        for r in compute_ranks(geometry):
            f = compute_rank_fields(geometry, r)
            out.append((int(r), StoreKey(model=model, tp_rank=f.tp_rank, pcp_rank=f.pcp_rank,
                                         dcp_rank=f.dcp_rank, pp_rank=f.pp_rank, group=g, hash_hex=h,
                                         cache_prefix=cache_prefix)))
    return tuple(out)
