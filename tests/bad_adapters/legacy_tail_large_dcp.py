"""The #53324 bug itself, only at DCP >= 16: the tail block keyed at the hit (H_h), not where it was stored."""

from tests.bad_adapters import Injected

RULES = "pr53324"
ADAPTER = Injected(name="legacy-tail-at-dcp-16", when=lambda g, n: g.parallel.dcp >= 16, tail_at_hit=True)


def WHERE(sc):
    return sc.geometry.parallel.dcp >= 16
