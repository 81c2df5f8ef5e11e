"""A draft-group bug: the EAGLE drop read from the first attention group only; a separate draft KV group that
carries the flag (merged into the same spec group by block size) is not seen, so no drop is taken."""

import attrs

from tests.bad_adapters import Injected


def _first_flag_only(g):
    first = next(i for i, x in enumerate(g.groups) if x.kind == "attention")
    return attrs.evolve(g, groups=tuple(attrs.evolve(x, eagle=x.eagle and i == first) for i, x in enumerate(g.groups)))


def _hidden(g, n=0):
    att = [x for x in g.groups if x.kind == "attention"]
    return bool(att) and not att[0].eagle and any(x.eagle for x in att)


RULES = "vllm-0.33.0"
ADAPTER = Injected(name="draft-group-flag-ignored", when=_hidden, store_geometry=_first_flag_only,
                   lookup_geometry=_first_flag_only, plan_geometry=_first_flag_only)


def WHERE(sc):
    return _hidden(sc.geometry)
