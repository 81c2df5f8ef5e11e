"""Engine adapters: the small protocol an engine implements so `kvspec conform --adapter` can check it.

An adapter answers four questions about one geometry, in tokens, the way the engine would:

* ``store_objects(geometry, prompt)`` — the (group, boundary) objects one request of P tokens stores;
* ``lookup(geometry, present, prompt)`` — the hit length and each group's tail boundary, given the
  objects present on every rank (E) and the lookup request's length N;
* ``load_plan(geometry, hit, tails)`` — the (group, block, key boundary) of every block it loads;
* ``name`` — what the report calls it.

Adapters that ship: ``kvspec.checks.adapters:IMPL`` (kvspec's own implementation, impl/, vLLM 0.33.0's
store rule), ``IMPL_PR53324`` (the same with the PR's store rule) and ``LEGACY`` (the tail keyed at the
hit, the loader before vLLM PR #53324, which fails with its counterexample), and
``kvspec.checks.vllm_oracle:VLLM`` (vLLM 0.33.0's own connector code, in ``.venv-vllm``). `kvspec conform
vllm` (checks/conform.py) drives more of vLLM than this protocol asks (refusals, every rank's key strings).
The porting guide (checks/README.md) shows an adapter in about 50 lines.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import attrs

from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry

Obj = tuple[int, int]  # (group id, boundary t): the object keyed H_t of that group


@runtime_checkable
class EngineAdapter(Protocol):
    """What `kvspec conform --adapter` asks of an engine (see the module docstring)."""

    name: str

    def store_objects(self, geometry: Geometry, prompt: int) -> Iterable[Obj]: ...

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int) -> tuple[int, dict[int, int]]: ...

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int]) -> list[tuple[int, int, int]]: ...


@attrs.frozen
class ImplAdapter:
    """kvspec's implementation (impl/): its store rule, its probe-minimizing lookup over E, its load plan."""

    name: str = "kvspec-impl"
    legacy: bool = False  # key the tail block at the hit (the loader before #53324)
    store_rule: str = "vllm-0.33.0"
    lookahead: int = 0  # hash lookahead λ (the vllm-0.33.0-lookahead rule set: 1)

    def _engine(self, geometry: Geometry) -> Any:
        import torch

        from kvspec.impl.engine import RankEngine
        return RankEngine(geometry, 0, None, torch.device("cpu"), store_rule=self.store_rule, lookahead=self.lookahead)

    def store_objects(self, geometry: Geometry, prompt: int) -> Iterable[Obj]:
        return self._engine(geometry).plan_objects(prompt) if prompt > 0 else []

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int) -> tuple[int, dict[int, int]]:
        from kvspec.impl.lookup import HybridLookup
        hit, tails = HybridLookup(geometry, prompt, lookahead=self.lookahead).run(
            lambda objs: {o for o in objs if o in present}, legacy=self.legacy)
        return hit, {int(g): int(t) for g, t in tails}

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int]) -> list[tuple[int, int, int]]:
        return [tuple(x) for x in self._engine(geometry).plan_load(hit, list(tails.items()))]


IMPL = ImplAdapter()
IMPL_PR53324 = ImplAdapter(name="kvspec-impl-pr53324", store_rule="pr53324")
IMPL_LOOKAHEAD = ImplAdapter(name="kvspec-impl-lookahead", store_rule="vllm-0.33.0", lookahead=1)
LEGACY = ImplAdapter(name="legacy-loader", legacy=True, store_rule="pr53324")


def load_adapter(spec: str) -> EngineAdapter:
    """Return the adapter named `module:object`; raise SpecError naming what is wrong."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise SpecError("adapter", f"--adapter takes module:object, got {spec!r}")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise SpecError("adapter", f"cannot load {spec}: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, EngineAdapter):
        raise SpecError("adapter", f"{spec} lacks name, store_objects, lookup or load_plan (checks/adapters.py)")
    return obj


# ---------------------------------------------------------------- running an adapter against the spec

FIELDS = ("stored", "hit", "tails", "load_keys")


def compute_adapter_outcome(adapter: EngineAdapter, scenario: Any) -> dict[str, Any]:
    """Return what the adapter says for a scenario: E (from its own store rule), hit, tails, load keys."""
    from kvspec.spec.rules import get_rules
    g, lookahead = scenario.geometry, get_rules(scenario.rules).lookahead  # a key H_t names [0, t + λ)
    if scenario.objects is not None:
        stored = set(scenario.objects)
    else:
        stored = {(int(x), int(t)) for r in scenario.stored for x, t in adapter.store_objects(g, r.prompt)
                  if t + lookahead <= r.shared}
    present = frozenset(stored - {(int(x), int(t)) for x, t, _ in scenario.evicted})  # E: on every rank
    hit, tails = adapter.lookup(g, present, scenario.prompt)
    plan = adapter.load_plan(g, hit, tails) if hit > 0 else []
    return {"stored": sorted(present), "hit": hit, "tails": sorted(tails.items()) if hit > 0 else [],
            "load_keys": [tuple(x) for x in plan]}


def compute_spec_outcome(scenario: Any) -> dict[str, Any]:
    """Return the same fields from the spec."""
    from kvspec.spec.scenario import evaluate_scenario
    out = evaluate_scenario(scenario)
    return {"stored": sorted((int(x), int(t)) for x, t in out.present), "hit": int(out.hit_length),
            "tails": sorted((int(x), int(t)) for x, t in out.tails),
            "load_keys": [(e.group, e.block, e.key_boundary) for e in out.load]}


def compare_adapter(adapter: EngineAdapter, scenario: Any) -> list[str]:
    """Return the fields on which the adapter and the spec disagree for one scenario."""
    try:
        got = compute_adapter_outcome(adapter, scenario)
    except Exception as exc:  # noqa: BLE001 - an adapter that raises disagrees on everything
        return [f"raised {type(exc).__name__}: {exc}"]
    want = compute_spec_outcome(scenario)
    return [f for f in FIELDS if got[f] != want[f]]


def format_explain_command(scenario: Any) -> str:
    """Return the `kvspec explain` command line of a scenario (to rerun a disagreement)."""
    g = scenario.geometry
    parts = ["kvspec explain", *(f"--group {gr.kind}:{gr.block_size}{':eagle' if gr.eagle else ''}" for gr in g.groups),
             f"--unit {g.unit}", f"--dcp {g.parallel.dcp}", f"--retention {g.retention}"]
    parts += [f"--stored {r.prompt}:{r.shared}" for r in scenario.stored]
    parts += [f"--evict {x}:{t}:{r}" for x, t, r in sorted(scenario.evicted)]
    return " ".join([*parts, f"--prompt {scenario.prompt}", f"--rules {scenario.rules}"])


def run_adapter_conformance(adapter: EngineAdapter, rules: str, examples: int = 300, seed: int = 0) -> dict[str, Any]:
    """Run the explain vectors of a rule set, then a Hypothesis search, against an adapter; return the report.

    A disagreement found by the search is shrunk by Hypothesis to a minimal scenario and reported as a
    runnable `kvspec explain` command.
    """
    import time

    import hypothesis
    from hypothesis import HealthCheck, given, settings

    from kvspec.spec.scenario import decode_scenario

    t0 = time.perf_counter()
    cases = [decode_scenario(inp) for inp in iterate_vector_inputs(rules) if "stored" not in inp]
    vector_bad = []
    for sc in cases:
        fields = compare_adapter(adapter, sc)
        if fields:
            vector_bad.append({"fields": fields, "command": format_explain_command(sc)})
    found: list[Any] = []

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @hypothesis.seed(seed)
    @given(scenario_strategy(rules))
    def search(sc: Any) -> None:
        fields = compare_adapter(adapter, sc)
        if fields:
            found[:] = [(sc, fields)]
            raise AssertionError(fields)

    with contextlib.suppress(AssertionError):
        search()
    shrunk = [{"fields": f, "command": format_explain_command(sc)} for sc, f in found]
    return {"adapter": adapter.name, "rules": rules, "vectors": len(cases), "vector_disagreements": vector_bad,
            "searched": examples, "search_disagreement": shrunk[0] if shrunk else None,
            "ok": not vector_bad and not shrunk, "seconds": round(time.perf_counter() - t0, 2)}


def iterate_vector_inputs(rules: str) -> Iterable[dict[str, Any]]:
    """Yield the inputs of the explain vectors of a rule set: the committed files when this is a source tree,
    else generated (the same cases: the tests keep the committed tree equal to what kvspec generates)."""
    import json
    from pathlib import Path

    import kvspec
    root = Path(kvspec.__file__).resolve().parent.parent / "vectors" / "cases" / rules / "explain" / "outcome"
    if root.is_dir():
        for case in sorted(root.glob("*/*")):
            yield json.loads((case / "input.json").read_text())
        return
    from .vectors import compute_cases
    yield from (inp for runner, _, _, _, inp, _ in compute_cases(rules) if runner == "explain")


def scenario_strategy(rules: str) -> Any:
    """Return a Hypothesis strategy of small hybrid scenarios (attention + Mamba, EAGLE, DCP, shared prefixes)."""
    from hypothesis import strategies as st

    from kvspec.spec.geometry import Group, Parallel, compute_lcm_span, compute_span
    from kvspec.spec.limits import compute_longest_prompt
    from kvspec.spec.scenario import Scenario, StoredRequest

    @st.composite
    def draw(d: Any) -> Any:
        u = d(st.integers(1, 16))
        dcp = d(st.sampled_from([1, 2, 4, 8]))
        qa, qm = d(st.integers(1, 8)), d(st.integers(1, 8))
        groups = [Group(kind="attention", block_size=qa * u, eagle=d(st.booleans())),
                  Group(kind="mamba", block_size=qm * u)]
        g = Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=dcp),
                     retention=d(st.sampled_from(["replay", "dense"])))
        cap = compute_longest_prompt(dcp, tuple(compute_span(g, i) for i in range(2)), 2, 0)
        top = max(1, min(4 * compute_lcm_span(g), cap))
        n = d(st.integers(1, top))
        stored = []
        for _ in range(d(st.integers(1, 2))):
            p = d(st.one_of(st.just(n), st.integers(0, top)))
            stored.append(StoredRequest(prompt=p, shared=d(st.integers(0, min(p, n)))))
        return Scenario(geometry=g, prompt=n, stored=tuple(stored), rules=rules)

    return draw()


def format_adapter_report(rep: dict[str, Any]) -> str:
    """Return the readable report of `kvspec conform --adapter`."""
    lines = [f"kvspec conform --adapter {rep['adapter']} against rule set {rep['rules']}: {rep['vectors']} vector "
             f"scenarios, {len(rep['vector_disagreements'])} disagree; {rep['searched']} searched scenarios"
             + (", a disagreement (shrunk):" if rep["search_disagreement"] else ", none disagree")
             + f" ({rep['seconds']} s)"]
    for d in rep["vector_disagreements"][:5]:
        lines.append(f"  vector: {', '.join(d['fields'])}: {d['command']}")
    if rep["search_disagreement"]:
        d = rep["search_disagreement"]
        lines.append(f"  search: {', '.join(d['fields'])}: {d['command']}")
    lines.append("result: conforms" if rep["ok"] else "result: DISAGREEMENT (exit 1)")
    return "\n".join(lines)
