"""A PCP-only bug: the whole port scales attention blocks by D·PCP (the context-parallel size) instead of D."""

from tests.bad_adapters import Injected, scale_attention

RULES = "pr53324"


def _scaled(g):
    return scale_attention(g, g.parallel.pcp)


ADAPTER = Injected(name="pcp-in-span", when=lambda g, n: g.parallel.pcp > 1, store_geometry=_scaled,
                   lookup_geometry=_scaled, plan_geometry=_scaled)


def WHERE(sc):
    return sc.geometry.parallel.pcp > 1
