"""A retention bug: dense Mamba retention (a state at every block end) stored as replay (checkpoints only)."""

import attrs

from tests.bad_adapters import Injected

RULES = "vllm-0.33.0"
ADAPTER = Injected(name="dense-stored-as-replay", when=lambda g, n: g.retention == "dense",
                   store_geometry=lambda g: attrs.evolve(g, retention="replay"))


def WHERE(sc):
    return sc.geometry.retention == "dense" and any(g.kind == "mamba" for g in sc.geometry.groups)
