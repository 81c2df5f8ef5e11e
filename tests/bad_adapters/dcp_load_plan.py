"""A DCP-scaling bug in the load plan only: blocks indexed by the per-rank block size, not the span b·D."""

import attrs

from kvspec.spec.geometry import Parallel
from tests.bad_adapters import Injected

RULES = "vllm-0.33.0-lookahead"
ADAPTER = Injected(name="load-plan-without-dcp", when=lambda g, n: g.parallel.dcp > 1,
                   plan_geometry=lambda g: attrs.evolve(g, parallel=Parallel(dcp=1)))


def WHERE(sc):
    return sc.geometry.parallel.dcp > 1
