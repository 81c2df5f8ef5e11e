"""A runnable engine adapter for `kvspec conform --adapter` (docs/porting.md), written as a port would be.

Run it from any folder:

    kvspec conform --adapter path/to/examples/adapter_template.py:ADAPTER --rules vllm-0.33.0

Each method is where your engine's own code goes. Here "the engine" is kvspec's torch implementation
(impl/), which plays the part of a port: it shares only geometry, keys and types with the spec, so the kit
really does compare two independent answers. Replace each `_engine.…` call with your engine's planner,
lookup and loader, and `CLAIMS` with what your port supports.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvspec.checks.conform.adapters import IMPL as _engine  # the stand-in engine; yours goes here
from kvspec.spec.geometry import Geometry
from kvspec.spec.rules import get_rules

Obj = tuple[int, int]  # (group id, boundary t): that group's block keyed by H_t, the hash of the first t tokens

# What this port supports, per axis of the coverage table (checks/conform/coverage.py); an axis left out: all of it.
# The kit runs only these classes and fails the run if one of them got no case.
CLAIMS: dict[str, list[object]] = {"dcp": [1, 2, 3, 4, 8, 16, 32, 64]}


class TemplateAdapter:
    name = "adapter-template"
    claims = CLAIMS

    def store_objects(self, geometry: Geometry, prompt: int, rules: str) -> Iterable[Obj]:
        """Every (group, t) the store path writes for one request of `prompt` tokens (each DCP rank writes its
        shard of each). `rules` names the rule set the port claims: get_rules(rules).lookahead is λ."""
        return _engine.store_objects(geometry, prompt, rules)

    def finish_objects(self, geometry: Geometry, prompt: int, decoded: int, decode_saves: bool,
                       rules: str) -> Iterable[Obj]:
        """What the store path writes for that request past its prefill once it decoded `decoded` tokens and
        finished (vLLM 0.34.0 stores the blocks whose lookahead token was an output) and, with `decode_saves`
        (vLLM's save_decode_cache), during its decode phase. A port that never stores past the prefill returns
        nothing here and claims {"writer": ["prefill"]}."""
        return _engine.finish_objects(geometry, prompt, decoded, decode_saves, rules)

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int,
               rules: str) -> tuple[int, dict[int, int]]:
        """The hit length for a request of `prompt` tokens, and {group id: the boundary its tail block's key
        names}. `present` is E, the objects every rank holds: answer your existence checks from it."""
        assert get_rules(rules).name == rules
        return _engine.lookup(geometry, present, prompt, rules)

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int], present: frozenset[Obj],
                  rules: str) -> list[tuple[int, int, int]]:
        """(group, block index, key boundary) of every block the load path gets, block index in the group's
        span s (attention: b·D tokens; Mamba: b). `present` is E again, for a loader that plans from it."""
        return _engine.load_plan(geometry, hit, tails, present, rules)


ADAPTER = TemplateAdapter()
