"""An interleave-only bug: the store path takes the DCP interleave I as a block multiplier (span b·D·I)."""

from tests.bad_adapters import Injected, scale_attention

RULES = "vllm-0.33.0"
ADAPTER = Injected(name="interleave-in-span", when=lambda g, n: g.parallel.interleave > 1,
                   store_geometry=lambda g: scale_attention(g, g.parallel.interleave))


def WHERE(sc):
    return sc.geometry.parallel.interleave > 1
