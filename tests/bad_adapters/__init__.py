"""Known-bad adapters: one plausible porting bug each, live only in one corner of the parameter space.

Each module defines ``ADAPTER`` (kvspec's implementation with the bug injected where it says), ``RULES`` (the
rule set the port claims) and ``WHERE(scenario) -> bool`` (where the bug can show). tests/test_adapters.py
runs the kit on every one of them: it must reject each, and every disagreement it reports must lie where
the bug lives — so a kit whose vectors or search miss a corner (large D, interleave, PCP, long prompts, …)
fails that test.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.checks.conform.adapters import IMPL, Obj
from kvspec.spec.geometry import Geometry

BUGS = ("legacy_tail_large_dcp", "interleave_span", "pcp_span", "large_prompt", "dcp_load_plan", "dense_as_replay",
        "draft_group_flag", "finish_save_forgotten")


@attrs.frozen
class Injected:
    """IMPL with a bug: `when(geometry, prompt)` says where; `geometry_of` and `lookup_prompt` say what goes wrong."""

    name: str
    when: Any
    store_geometry: Any = None  # the geometry the buggy store rule sees
    plan_geometry: Any = None  # the geometry the buggy load plan sees
    lookup_geometry: Any = None
    lookup_prompt: Any = None  # the length the buggy lookup probes up to
    tail_at_hit: bool = False  # the legacy loader's tail key
    finish: Any = None  # (geometry, decoded, decode_saves) -> bool: where the port stores nothing past its prefill

    def store_objects(self, geometry: Geometry, prompt: int, rules: str) -> list[Obj]:
        g = self.store_geometry(geometry) if self.store_geometry and self.when(geometry, prompt) else geometry
        return list(IMPL.store_objects(g, prompt, rules))

    def finish_objects(self, geometry: Geometry, prompt: int, decoded: int, decode_saves: bool,
                       rules: str) -> list[Obj]:
        if self.finish is not None and self.finish(geometry, decoded, decode_saves):
            return []
        return list(IMPL.finish_objects(geometry, prompt, decoded, decode_saves, rules))

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int, rules: str) -> tuple[int, dict[int, int]]:
        on = self.when(geometry, prompt)
        g = self.lookup_geometry(geometry) if self.lookup_geometry and on else geometry
        n = self.lookup_prompt(prompt) if self.lookup_prompt and on else prompt
        hit, tails = IMPL.lookup(g, present, n, rules)
        if self.tail_at_hit and on and hit:
            tails = dict.fromkeys(tails, hit)
        return hit, tails

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int], present: frozenset[Obj],
                  rules: str) -> list[tuple[int, int, int]]:
        g = self.plan_geometry(geometry) if self.plan_geometry and self.when(geometry, hit) else geometry
        return IMPL.load_plan(g, hit, tails, present, rules)


def scale_attention(geometry: Geometry, factor: int) -> Geometry:
    """Return the geometry with every attention block `factor` times larger (a span computed wrongly)."""
    return attrs.evolve(geometry, groups=tuple(attrs.evolve(g, block_size=g.block_size * factor)
                                               if g.kind == "attention" else g for g in geometry.groups))
