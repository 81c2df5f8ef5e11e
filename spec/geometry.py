"""Frozen geometry value types: groups, the parallel layout and the whole cache geometry.

Construction validates every rule of the spec (section 1 of the spec issue) and raises
SpecError naming the rule.  Derived quantities (span, lcm span L, fine mode, alignment a)
are computed by functions, never stored.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import attrs

from .errors import SpecError, require
from .limits import (
    MAX_BLOCK,
    MAX_DCP,
    MAX_GROUPS,
    MAX_PCP,
    RULE_LIMIT_BLOCK,
    RULE_LIMIT_DCP,
    RULE_LIMIT_GROUPS,
    RULE_LIMIT_PCP,
    check_count,
)
from .types import KIND_ALIASES, KINDS, RETENTIONS, GroupId, Rank, Tokens

# Rule ids used by construction (stable: CLI output, vectors and tests name them).
RULE_KIND = "group-kind"
RULE_BLOCK = "block-size-positive"
RULE_UNIT = "unit-positive"
RULE_UNIT_DIVIDES = "unit-divides-span"
RULE_DCP = "dcp-positive"
RULE_PCP = "pcp-positive"
RULE_PCP_HYBRID = "pcp-single-kind"
RULE_INTERLEAVE = "interleave-positive"
RULE_INTERLEAVE_DIVIDES = "interleave-divides-block"
RULE_INTERLEAVE_HYBRID = "hybrid-dcp-interleave"
RULE_GROUPS = "groups-nonempty"
RULE_RETENTION = "retention"
RULE_INT = "integer-field"
RULE_EAGLE_KIND = "eagle-attention"
RULE_DRAFT_REACH = "draft-reach"
MAX_DRAFT_REACH = 64  # tokens past a position an EAGLE-family drafter's KV reads (K modules of multi-module MTP)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _int_field(rule: str, limit: int = 0, limit_rule: str = "") -> Validator:
    def check(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not _is_int(value):
            raise SpecError(RULE_INT, f"{attribute.name} must be an integer, got {value!r}")
        if value < 1:
            raise SpecError(rule, f"{attribute.name} must be >= 1, got {value}")
        if limit:
            check_count(value, limit, limit_rule, attribute.name)

    return check


def resolve_kind(name: str) -> str:
    """Return the spec's kind for a kind name or an alias (KIND_ALIASES: mla -> attention, gdn/kda/linear -> mamba)."""
    return KIND_ALIASES.get(name, name)


def _kind(inst: object, attribute: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if value not in KINDS:
        raise SpecError(RULE_KIND, f"unknown group kind {value!r} (known: {', '.join(KINDS)}; aliases: "
                        f"{', '.join(f'{a}={k}' for a, k in KIND_ALIASES.items())})")


def _bool(inst: object, attribute: attrs.Attribute, value: object) -> None:  # type: ignore[type-arg]
    if not isinstance(value, bool):
        raise SpecError(RULE_INT, f"{attribute.name} must be a bool, got {value!r}")


@attrs.frozen(kw_only=True)
class Group:
    """One KV-cache group: kind, per-rank block size b (tokens), EAGLE flag."""

    kind: str = attrs.field(validator=_kind)
    block_size: int = attrs.field(validator=_int_field(RULE_BLOCK, MAX_BLOCK, RULE_LIMIT_BLOCK))
    eagle: bool = attrs.field(default=False, validator=_bool)

    def __attrs_post_init__(self) -> None:
        require(not (self.eagle and self.kind != "attention"), RULE_EAGLE_KIND,
                f"the EAGLE flag marks the attention group whose hit the drafter shortens; a {self.kind} group "
                "cannot carry it")


@attrs.frozen(kw_only=True)
class Parallel:
    """The parallel layout: DCP size D, interleave I, PCP size; ranks 0..D-1 write keys."""

    dcp: int = attrs.field(default=1, validator=_int_field(RULE_DCP, MAX_DCP, RULE_LIMIT_DCP))
    interleave: int = attrs.field(default=1, validator=_int_field(RULE_INTERLEAVE))
    pcp: int = attrs.field(default=1, validator=_int_field(RULE_PCP, MAX_PCP, RULE_LIMIT_PCP))


@attrs.frozen(kw_only=True)
class RankFields:
    """The rank fields one DCP rank writes into its keys (tp, pcp, dcp, pp)."""

    tp_rank: int
    pcp_rank: int
    dcp_rank: int
    pp_rank: int


def _to_groups(value: Iterable[Group]) -> tuple[Group, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True, cache_hash=True)
class Geometry:
    """The whole cache geometry: prefix-match unit u, groups (ids 0..), layout, Mamba retention."""

    unit: int = attrs.field(validator=_int_field(RULE_UNIT))
    groups: tuple[Group, ...] = attrs.field(converter=_to_groups)
    parallel: Parallel = attrs.field(factory=Parallel)
    retention: str = attrs.field(default="replay")
    # tokens past p the EAGLE-family drafter's KV at p reads: 1 (EAGLE, EAGLE3, MTP), K (multi-module MTP: vLLM's
    # num_speculative_tokens); only with an EAGLE-flagged group
    draft_reach: int = attrs.field(default=1, validator=_int_field(RULE_DRAFT_REACH, MAX_DRAFT_REACH, RULE_DRAFT_REACH))

    @groups.validator
    def _check_groups(self, attribute: attrs.Attribute, value: tuple[Group, ...]) -> None:  # type: ignore[type-arg]
        require(len(value) >= 1, RULE_GROUPS, "a geometry needs at least one group")
        check_count(len(value), MAX_GROUPS, RULE_LIMIT_GROUPS, "group count")
        for g in value:
            if not isinstance(g, Group):
                raise SpecError(RULE_KIND, f"not a Group: {g!r}")

    @retention.validator
    def _check_retention(self, attribute: attrs.Attribute, value: str) -> None:  # type: ignore[type-arg]
        require(value in RETENTIONS, RULE_RETENTION,
                f"unknown retention {value!r} (known: {', '.join(RETENTIONS)})")

    def __attrs_post_init__(self) -> None:
        for gid, g in enumerate(self.groups):  # what vLLM asks (resolve_kv_cache_block_sizes): u divides every span
            span = g.block_size * self.parallel.dcp if g.kind == "attention" else g.block_size
            if span % self.unit != 0:
                raise SpecError(RULE_UNIT_DIVIDES,
                                f"unit {self.unit} does not divide the span {span} of group {gid} (block size "
                                f"{g.block_size}{f' × DCP {self.parallel.dcp}' if span != g.block_size else ''})")
        require(self.draft_reach == 1 or any(g.eagle for g in self.groups), RULE_DRAFT_REACH,
                f"draft reach {self.draft_reach} names an EAGLE-family drafter: flag its group (KIND:BLOCK:eagle)")
        kinds = {g.kind for g in self.groups}
        p = self.parallel
        require(not (p.pcp > 1 and len(kinds) > 1), RULE_PCP_HYBRID,
                f"PCP {p.pcp} > 1 is refused with more than one group kind (hybrid)")
        require(not (p.interleave != 1 and p.dcp > 1 and len(kinds) > 1), RULE_INTERLEAVE_HYBRID,
                f"interleave {p.interleave} != 1 is refused with DCP {p.dcp} on a hybrid geometry")
        for gid, g in enumerate(self.groups):
            if g.kind == "attention" and g.block_size % p.interleave != 0:
                raise SpecError(RULE_INTERLEAVE_DIVIDES,
                                f"interleave {p.interleave} does not divide block size {g.block_size} of group {gid}")


def make_geometry(unit: int, groups: list[tuple[str, int, bool]] | tuple[Group, ...], dcp: int = 1,
                  retention: str = "replay", interleave: int = 1, pcp: int = 1) -> Geometry:
    """Return a validated Geometry from plain values (kind, block size, eagle) per group."""
    gs = tuple(g if isinstance(g, Group) else Group(kind=g[0], block_size=g[1], eagle=g[2]) for g in groups)
    return Geometry(unit=unit, groups=gs, parallel=Parallel(dcp=dcp, interleave=interleave, pcp=pcp),
                    retention=retention)


@functools.lru_cache(maxsize=4096)
def compute_span(geometry: Geometry, group: GroupId) -> Tokens:
    """Return the span s_g: b*D for attention groups, b for Mamba groups."""
    g = geometry.groups[group]
    return Tokens(g.block_size * geometry.parallel.dcp if g.kind == "attention" else g.block_size)


@functools.lru_cache(maxsize=4096)
def compute_spans(geometry: Geometry) -> tuple[Tokens, ...]:
    """Return (s_0, s_1, …), every group's span in id order."""
    return tuple(compute_span(geometry, GroupId(i)) for i in range(len(geometry.groups)))


@functools.lru_cache(maxsize=4096)
def compute_lcm_span(geometry: Geometry) -> Tokens:
    """Return L, the lcm of all group spans."""
    return Tokens(math.lcm(*(compute_span(geometry, GroupId(i)) for i in range(len(geometry.groups)))))


@functools.lru_cache(maxsize=4096)
def is_fine(geometry: Geometry) -> bool:
    """Return whether fine-grained hits are on: some Mamba group has (D=1, b>u) or (D>1, b>=u)."""
    d, u = geometry.parallel.dcp, geometry.unit
    return any(g.kind == "mamba" and ((d == 1 and g.block_size > u) or (d > 1 and g.block_size >= u))
               for g in geometry.groups)


@functools.lru_cache(maxsize=4096)
def compute_alignment(geometry: Geometry) -> Tokens:
    """Return the hit alignment a: u when fine hits are on, else L."""
    return Tokens(geometry.unit if is_fine(geometry) else compute_lcm_span(geometry))


@functools.lru_cache(maxsize=4096)
def has_eagle(geometry: Geometry) -> bool:
    """Return whether any group carries the EAGLE flag (e = 1 in the store rule)."""
    return any(g.eagle for g in geometry.groups)


def is_eagle_spec(geometry: Geometry, group: GroupId) -> bool:
    """Return whether any group with the same (kind, block size) as g carries the EAGLE flag (merged spec groups OR it)."""
    g = geometry.groups[group]
    return any(h.eagle for h in geometry.groups if (h.kind, h.block_size) == (g.kind, g.block_size))


@functools.lru_cache(maxsize=4096)  # pure over a frozen value: memoized for exhaustive runs
def compute_ranks(geometry: Geometry) -> tuple[Rank, ...]:
    """Return the DCP ranks that write and read keys: 0..D-1."""
    return tuple(Rank(r) for r in range(geometry.parallel.dcp))


def compute_rank_fields(geometry: Geometry, rank: Rank) -> RankFields:
    """Return the key rank fields of DCP rank r (the DCP group is the TP group: tp_rank = r)."""
    if not 0 <= rank < geometry.parallel.dcp:
        raise SpecError("rank-range", f"rank {rank} outside 0..{geometry.parallel.dcp - 1}")
    return RankFields(tp_rank=rank, pcp_rank=0, dcp_rank=rank, pp_rank=0)


@functools.lru_cache(maxsize=4096)
def compute_group_ids(geometry: Geometry, kind: str) -> tuple[GroupId, ...]:
    """Return the ids of the groups of one kind, in id order."""
    return tuple(GroupId(i) for i, g in enumerate(geometry.groups) if g.kind == kind)


# ---------------------------------------------------------------- JSON (the one geometry codec)

GEOMETRY_KEYS = ("unit", "dcp", "interleave", "pcp", "retention", "groups", "draft_reach")  # a geometry's input fields


def encode_geometry_input(geometry: Geometry) -> dict[str, Any]:
    """Return a geometry's input fields as JSON (the one geometry codec: scenarios, vectors, rank jobs)."""
    p = geometry.parallel
    return {"unit": geometry.unit, "dcp": p.dcp, "interleave": p.interleave, "pcp": p.pcp,
            "retention": geometry.retention,
            "groups": [{"kind": gr.kind, "block_size": gr.block_size, "eagle": gr.eagle} for gr in geometry.groups],
            **({"draft_reach": geometry.draft_reach} if geometry.draft_reach != 1 else {})}


def decode_geometry_input(raw: Mapping[str, Any]) -> Geometry:
    """Return the Geometry of a JSON object's geometry fields (defaults: u = 1, D = 1, replay); SpecError otherwise."""
    groups_raw = raw.get("groups")
    require(isinstance(groups_raw, list), "groups-nonempty", "groups must be a JSON list")
    groups = []
    for gr in cast(list[Any], groups_raw):
        require(isinstance(gr, dict) and {"kind", "block_size"} <= set(gr) <= {"kind", "block_size", "eagle"},
                "group-kind", f"a group is {{\"kind\", \"block_size\", \"eagle\"}}, got {gr!r}")
        kind = gr["kind"]
        groups.append(Group(kind=resolve_kind(kind) if isinstance(kind, str) else kind, block_size=gr["block_size"],
                            eagle=gr.get("eagle", False)))
    return Geometry(unit=raw.get("unit", 1), groups=tuple(groups),
                    parallel=Parallel(dcp=raw.get("dcp", 1), interleave=raw.get("interleave", 1), pcp=raw.get("pcp", 1)),
                    retention=raw.get("retention", "replay"), draft_reach=raw.get("draft_reach", 1))
