"""Named geometries: the real deployment of PR #53324 and tiny ones for exhaustive runs."""

from __future__ import annotations

from .errors import SpecError
from .geometry import Geometry, Group, Parallel


def _g(kind: str, b: int, eagle: bool = False) -> Group:
    return Group(kind=kind, block_size=b, eagle=eagle)


PRESETS: dict[str, Geometry] = {
    # Kimi-K3, DCP 8 + DSpark (EAGLE-style), --prefix-match-unit 128: attention span 12288, Mamba 1536.
    "kimi-k3-dcp8": Geometry(unit=128, groups=(_g("attention", 1536, True), _g("mamba", 1536)),
                             parallel=Parallel(dcp=8), retention="replay"),
    # The same with the DSpark draft MLA as its own (equal-spec) group.
    "kimi-k3-dcp8-draft": Geometry(unit=128, groups=(_g("attention", 1536), _g("attention", 1536, True),
                                                     _g("mamba", 1536)),
                                   parallel=Parallel(dcp=8), retention="replay"),
    # Tiny: the same shape scaled down (u=1, b=4, D=2: attention span 8, Mamba 4).
    "tiny-dcp2": Geometry(unit=1, groups=(_g("attention", 4, True), _g("mamba", 4)),
                          parallel=Parallel(dcp=2), retention="replay"),
    # Small CI geometry for live runs: u=4, b=16, D=2 (attention span 32, Mamba 16).
    "small-dcp2": Geometry(unit=4, groups=(_g("attention", 16, True), _g("mamba", 16)),
                           parallel=Parallel(dcp=2), retention="replay"),
    "small-dcp4": Geometry(unit=4, groups=(_g("attention", 16, True), _g("attention", 16), _g("mamba", 16)),
                           parallel=Parallel(dcp=4), retention="dense"),
    # Kimi-K3 as SGLang 0.5.23 serves it from HiCache L3: MLA pages of 1024 tokens at DCP 8 (per-rank block 128, the
    # unit), KDA states on a 4096-token grid, DSPARK (no EAGLE flag: SGLang allows no EAGLE under DCP).
    "kimi-k3-sglang-dcp8": Geometry(unit=128, groups=(_g("attention", 128), _g("mamba", 4096)),
                                    parallel=Parallel(dcp=8), retention="replay"),
    # The same shape scaled down for SGLang: page 4 at D=2 (per-rank block 2), Mamba grid 8.
    "tiny-sglang-dcp2": Geometry(unit=2, groups=(_g("attention", 2), _g("mamba", 8)),
                                 parallel=Parallel(dcp=2), retention="replay"),
    # Two Mamba groups of different block sizes (no DCP): exercises the non-simple fixed point.
    "tiny-two-mamba": Geometry(unit=2, groups=(_g("attention", 4, True), _g("mamba", 4), _g("mamba", 6)),
                               parallel=Parallel(dcp=1), retention="dense"),
}


def get_preset(name: str) -> Geometry:
    """Return the named preset geometry."""
    if name not in PRESETS:
        raise SpecError("preset", f"unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    return PRESETS[name]
