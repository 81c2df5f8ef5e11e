"""Content: does every loaded byte equal what the reader would compute itself?

Keys say which object is loaded; this says whether its bytes are right, over the synthetic model's
dependency sets (impl/synthetic.py): attention KV at position p depends on tokens [0, p]; the KV of
an EAGLE-flagged (draft) attention group at p on [0, p + 1] — the next token, which after a prompt's
last position is the sampled token, never a prompt token; a Mamba state after t tokens on [0, t).

A stored request shares its first S tokens with the reader and none after (its own tokens, then
its sampled token), so the bytes it wrote at p are right iff p's dependencies end before S. Under
write-once, an object's bytes are the first writer's: the first stored request, in order, whose
visible objects hold it.
"""

from __future__ import annotations

from typing import Any

from .geometry import Geometry
from .ops import IntOps
from .scenario import Outcome, Scenario, compute_request_visible
from .store import Obj
from .types import GroupId

KIND_ATTENTION, KIND_DRAFT, KIND_MAMBA = 0, 1, 2  # what a loaded byte is, as an integer (a Z3 theorem ranges over it)
DRAFT_REACH = 1  # tokens past p that an EAGLE drafter's KV at p depends on (the next one; Geometry.draft_reach: K for MTP)


def compute_dependency_end_of(ops: Any, kind: Any, position: Any, reach: Any) -> Any:
    """Return the end of a byte's dependencies: p (Mamba state after p tokens), p + 1 + L (draft KV, reach L), p + 1."""
    return ops.If(kind == KIND_MAMBA, position, ops.If(kind == KIND_DRAFT, position + 1 + reach, position + 1))


def compute_dependency_end(geometry: Geometry, group: GroupId, position: int) -> int:
    """Return the end of what group g's bytes at position p depend on: p + 1 (attention), p + 1 + the drafter's reach
    (an EAGLE-flagged draft group: DRAFT_REACH = 1 for EAGLE, K for K-module MTP), p (a Mamba state after p tokens)."""
    g = geometry.groups[group]
    kind = KIND_MAMBA if g.kind == "mamba" else KIND_DRAFT if g.eagle else KIND_ATTENTION
    return int(compute_dependency_end_of(IntOps, kind, position, geometry.draft_reach))


def compute_first_writers(scenario: Scenario) -> dict[Obj, int]:
    """Return, for every object a stored request made visible, the index of the first request that stored it."""
    out: dict[Obj, int] = {}
    for k, r in enumerate(scenario.stored):
        for o in compute_request_visible(scenario.geometry, scenario.rules, r, scenario.schedule):
            out.setdefault(o, k)
    return out


def compute_wrong_positions(scenario: Scenario, outcome: Outcome) -> tuple[tuple[GroupId, int], ...]:
    """Return (g, p) of every loaded position whose writer's bytes differ from the reader's own: p's dependencies
    end past the writer's shared prefix S (a Mamba entry is the state at h, position h)."""
    if scenario.objects is not None or outcome.hit_length <= 0:
        return ()
    writers = compute_first_writers(scenario)
    h, g = outcome.hit_length, scenario.geometry
    bad: list[tuple[GroupId, int]] = []
    for e in outcome.load:
        w = writers.get((e.group, e.key_boundary))
        if w is None or not e.present:  # not stored, or a shard lost: the load fails (-704) and brings no bytes
            continue
        shared, reach = scenario.stored[w].shared, compute_dependency_end(g, e.group, 0)  # the end is p + reach
        positions = (h,) if g.groups[e.group].kind == "mamba" else range(e.start, min(e.end, h))
        bad.extend((e.group, p) for p in positions if p + reach > shared)
    return tuple(bad)
