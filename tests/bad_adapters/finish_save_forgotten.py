"""A port of vLLM 0.34.0 that saves the decode phase (save_decode_cache) but forgot the finish-time lookahead save
(register_finished_lookahead_save): a writer that decoded without the option stores nothing past its prefill."""

from kvspec.spec.rules import compute_lookahead
from tests.bad_adapters import Injected

RULES = "vllm-0.34.0"
ADAPTER = Injected(name="finish-save-forgotten", when=lambda g, n: False,
                   finish=lambda g, decoded, decode_saves: not decode_saves)


def WHERE(sc):
    return compute_lookahead(sc.rules, sc.geometry) > 0 and any(
        r.decoded and not r.save_decode_cache for r in sc.stored)
