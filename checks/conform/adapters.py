"""Engine adapters: the small protocol an engine implements so `kvspec conform --adapter` can check it.

An adapter answers three questions about one geometry under one rule set (its name, e.g. ``vllm-0.33.0``;
``kvspec.spec.rules.get_rules(rules)`` has its data: λ, store rule, tail rule), in tokens, the way the
engine would (docs/porting.md):

* ``store_objects(geometry, prompt, rules)`` — the (group, boundary) objects one request of P tokens stores;
* ``lookup(geometry, present, prompt, rules)`` — the hit length and each group's tail boundary, given the
  objects present on every rank (E) and the lookup request's length N;
* ``load_plan(geometry, hit, tails, present, rules)`` — the (group, block, key boundary) of every block it
  loads (E is given for an engine that plans from what it saw; the spec's plan does not need it);
* ``name`` — what the report calls it; optionally ``claims`` — the classes it supports, per axis of
  checks/conform/coverage.py (``{"dcp": [1, 2, 4, 8], "pcp": ["PCP=1"]}``; an axis left out: every value) and the
  ``writer`` axis (``prefill``: every stored request was cut at its prefill; ``finished``: some writer decoded
  before finishing, or saved its decode phase). The kit runs only the claimed classes and fails a run that leaves
  a claimed class without a case;
* optionally ``finish_objects(geometry, prompt, decoded, decode_saves, rules)`` — what a writer of P prompt tokens
  stores past its prefill once it decoded O tokens (vLLM 0.34.0's finish-time save; with ``decode_saves``, vLLM's
  save_decode_cache: the decode phase). An adapter without it stores nothing past its prefill, which the
  ``finished`` vectors of a vLLM rule set reject unless it claims ``{"writer": ["prefill"]}``.

Adapters that ship: ``kvspec.checks.conform.adapters:IMPL`` (kvspec's implementation, impl/, following whatever
rule set it is told), ``LEGACY`` (the tail keyed at the hit, the loader before vLLM PR #53324, which fails
with its counterexample), ``kvspec.checks.conform.vllm_oracle:VLLM`` (vLLM's own connector code, function by function,
in a vLLM venv), ``kvspec.checks.conform.sglang_oracle:SGLANG`` (SGLang's own code), and examples/adapter_template.py (a
port written from the porting guide alone).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import sys
import time
import traceback
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from kvspec.checks.conform.coverage import (
    AXES,
    CLASSES,
    HypothesisDraw,
    classify,
    compute_boundary_classes,
    compute_class_scenarios,
    draw_scenario,
)
from kvspec.checks.conform.vectors import compute_cases
from kvspec.checks.data import find_vector_cases
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry
from kvspec.spec.rules import (
    STORE_PR53324,
    STORE_VLLM_0_33,
    TAIL_HIT,
    RuleSet,
    coerce_rules,
    compute_lookahead,
    get_rules,
)
from kvspec.spec.scenario import decode_scenario, encode_scenario, evaluate_scenario, has_outputs

Obj = tuple[int, int]  # (group id, boundary t): the object keyed H_t of that group


@runtime_checkable
class EngineAdapter(Protocol):
    """What `kvspec conform --adapter` asks of an engine (see the module docstring)."""

    name: str

    def store_objects(self, geometry: Geometry, prompt: int, rules: str) -> Iterable[Obj]: ...

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int,
               rules: str) -> tuple[int, dict[int, int]]: ...

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int], present: frozenset[Obj],
                  rules: str) -> list[tuple[int, int, int]]: ...


def compute_impl_store_rule(rules: RuleSet | str) -> str:
    """Return the implementation's store rule (impl/engine.py STORE_RULES) for a rule set: read from its store-rule
    field, never its name (impl/ knows no rule set)."""
    store = coerce_rules(rules).store
    if store not in (STORE_PR53324, STORE_VLLM_0_33):
        raise SpecError("impl-rules", f"the implementation (impl/) has no store rule for rule set {rules} "
                                      f"(store rule {store}): only pr53324's and vLLM's")
    from kvspec.impl.job import STORE_PR53324 as IMPL_TAIL
    from kvspec.impl.job import STORE_VLLM as IMPL_CHECKPOINT
    return IMPL_TAIL if store == STORE_PR53324 else IMPL_CHECKPOINT


@attrs.frozen
class ImplAdapter:
    """kvspec's implementation (impl/): its store rule, its probe-minimizing lookup over E, its load plan, each
    chosen from the rule set's data (store rule, tail rule, λ) unless fixed here."""

    name: str = "kvspec-impl"
    legacy: bool = False  # key the tail block at the hit (the loader before #53324), whatever the rule set says
    store_rule: str | None = None  # fix impl/'s store rule ("prompt-tail" or "checkpoint"); None: the rule set's

    def _store_rule(self, rules: str) -> str:
        return self.store_rule if self.store_rule is not None else compute_impl_store_rule(rules)

    def _engine(self, geometry: Geometry, rules: str) -> Any:
        import torch

        from kvspec.impl.engine import RankEngine
        rs = get_rules(rules)
        return RankEngine(geometry, 0, None, torch.device("cpu"), store_rule=self._store_rule(rules),
                          lookahead=compute_lookahead(rs, geometry), deferred_saves=rs.deferred_saves,
                          decode_states=rs.decode_states)

    def store_objects(self, geometry: Geometry, prompt: int, rules: str) -> Iterable[Obj]:
        return self._engine(geometry, rules).plan_objects(prompt) if prompt > 0 else []

    def finish_objects(self, geometry: Geometry, prompt: int, decoded: int, decode_saves: bool,
                       rules: str) -> Iterable[Obj]:
        if prompt <= 0:
            return []
        eng = self._engine(geometry, rules)
        return set(eng.plan_objects(prompt, decoded=decoded, decode_saves=decode_saves)) - set(eng.plan_objects(prompt))

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int,
               rules: str) -> tuple[int, dict[int, int]]:
        from kvspec.impl.lookup import HybridLookup
        hit, tails = HybridLookup(geometry, prompt, lookahead=compute_lookahead(get_rules(rules), geometry)).run(
            lambda objs: {o for o in objs if o in present}, legacy=self.legacy or get_rules(rules).tail_key == TAIL_HIT)
        return hit, {int(g): int(t) for g, t in tails}

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int], present: frozenset[Obj],
                  rules: str) -> list[tuple[int, int, int]]:
        return [tuple(x) for x in self._engine(geometry, rules).plan_load(hit, list(tails.items()))]


IMPL = ImplAdapter()
LEGACY = ImplAdapter(name="legacy-loader", legacy=True, store_rule="prompt-tail")


def load_adapter(spec: str) -> EngineAdapter:
    """Return the adapter `module:OBJECT` or `path/to/file.py:OBJECT`; raise SpecError naming what is wrong.

    A module is imported with the current folder on the path (as `python -m` does); a file is loaded by path,
    with its own folder on the path, so the command works from any folder."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise SpecError("adapter", f"--adapter takes MODULE:OBJECT or path/to/file.py:OBJECT, got {spec!r}")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).resolve()
            if not path.is_file():
                raise SpecError("adapter", f"--adapter {spec}: no file {target}")
            sys.path.insert(0, str(path.parent))
            mod_spec = importlib.util.spec_from_file_location(f"kvspec_adapter_{path.stem}", path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module
            mod_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(target)
        obj = getattr(module, attr)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the adapter's module raises on import is reported, with where
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
        raise SpecError("adapter", f"cannot load {spec}: {type(exc).__name__}: {exc}{where}") from None
    if not isinstance(obj, EngineAdapter):
        raise SpecError("adapter", f"{spec} lacks name, store_objects, lookup or load_plan (docs/porting.md)")
    return obj


# ---------------------------------------------------------------- running an adapter against the spec

FIELDS = ("stored", "hit", "tails", "load_keys")
SHOWN = 5  # disagreements the readable report prints (all are in --json)


def compute_adapter_outcome(adapter: EngineAdapter, scenario: Any) -> dict[str, Any]:
    """Return what the adapter says for a scenario: E (from its own store rule), hit, tails, load keys."""
    g, rules = scenario.geometry, scenario.rules.name  # an adapter is given the rule set's name
    lookahead = compute_lookahead(get_rules(rules), g)  # a key H_t names [0, t + λ)
    if scenario.objects is not None:
        stored = set(scenario.objects)
    else:
        stored = set()
        for r in scenario.stored:
            mine = list(adapter.store_objects(g, r.prompt, rules))
            finish = getattr(adapter, "finish_objects", None)
            if has_outputs(r) and finish is not None:
                mine += list(finish(g, r.prompt, r.decoded, r.save_decode_cache, rules))
            stored |= {(int(x), int(t)) for x, t in mine if t + lookahead <= r.shared}
    present = frozenset(stored - {(int(x), int(t)) for x, t, _ in scenario.evicted})  # E: on every rank
    hit, tails = adapter.lookup(g, present, scenario.prompt, rules)
    plan = adapter.load_plan(g, hit, tails, present, rules) if hit > 0 else []
    return {"stored": sorted(present), "hit": hit, "tails": sorted(tails.items()) if hit > 0 else [],
            "load_keys": sorted(tuple(int(v) for v in x) for x in plan)}


def compute_spec_outcome(scenario: Any) -> dict[str, Any]:
    """Return the same fields from the spec."""
    out = evaluate_scenario(scenario)
    return {"stored": sorted((int(x), int(t)) for x, t in out.present), "hit": int(out.hit_length),
            "tails": sorted((int(x), int(t)) for x, t in out.tails),
            "load_keys": sorted((e.group, e.block, e.key_boundary) for e in out.load)}


def compare_adapter(adapter: EngineAdapter, scenario: Any) -> dict[str, Any] | None:
    """Return how the adapter disagrees with the spec on one scenario (None when it agrees): the fields, each
    with the expected and the actual value, or the exception the adapter raised with its traceback."""
    try:
        got = compute_adapter_outcome(adapter, scenario)
    except Exception as exc:  # noqa: BLE001 - an adapter that raises disagrees on everything; its traceback is kept
        return {"fields": ["raised"], "raised": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc)[-12:])}
    want = compute_spec_outcome(scenario)
    bad = [f for f in FIELDS if got[f] != want[f]]
    if not bad:
        return None
    return {"fields": bad, "expected": {f: want[f] for f in bad}, "actual": {f: got[f] for f in bad}}


def format_explain_command(scenario: Any) -> str:
    """Return the `kvspec explain` command line of a scenario (to rerun a disagreement)."""
    g = scenario.geometry
    parts = ["kvspec explain", *(f"--group {gr.kind}:{gr.block_size}{':eagle' if gr.eagle else ''}" for gr in g.groups),
             f"--unit {g.unit}", f"--dcp {g.parallel.dcp}", f"--retention {g.retention}"]
    if g.parallel.interleave != 1:
        parts.append(f"--interleave {g.parallel.interleave}")
    if g.parallel.pcp != 1:
        parts.append(f"--pcp {g.parallel.pcp}")
    parts += [f"--stored {r.prompt}{f'+{r.decoded}' if r.decoded else ''}:{r.shared}{':' + r.rules.name if r.rules else ''}"
              for r in scenario.stored]
    parts += ["--save-decode-cache"] if any(r.save_decode_cache for r in scenario.stored) else []
    parts += [f"--evict {x}:{t}:{r}" for x, t, r in sorted(scenario.evicted)]
    return " ".join([*parts, f"--prompt {scenario.prompt}", f"--rules {scenario.rules.name}"])


def _claimed(adapter: EngineAdapter) -> Mapping[str, Collection[str]]:
    """Return the adapter's claims per axis as strings (no `claims`: every value of every axis)."""
    raw = getattr(adapter, "claims", None) or {}
    unknown = set(raw) - {*AXES, WRITER_AXIS}
    if unknown:
        raise SpecError("adapter-claims", f"{adapter.name} claims unknown axes {sorted(unknown)} "
                                          f"(known: {(*AXES, WRITER_AXIS)})")
    out: dict[str, Collection[str]] = {}
    for axis, values in raw.items():
        vals = {str(v) for v in values}
        if axis in ("interleave", "pcp"):  # booleans or the table's words
            name = "I" if axis == "interleave" else "PCP"
            vals = {f"{name}>1" if v in ("True", f"{name}>1", ">1") else f"{name}=1" for v in vals}
        out[axis] = vals
    return out


WRITER_AXIS = "writer"  # prefill: every stored request cut at its prefill; finished: one decoded or saved its decode


def compute_writer_kind(scenario: Any) -> str:
    """Return the scenario's value on the writer axis."""
    return "finished" if any(has_outputs(r) for r in scenario.stored) else "prefill"


def _in_claims(claims: Mapping[str, Collection[str]], values: Mapping[str, str]) -> bool:
    """Return whether the values lie in the claims (an axis the values do not name is not constrained: a class of
    checks/conform/coverage.py names no writer)."""
    return all(a not in values or values[a] in vs for a, vs in claims.items())


def compute_axis_values(scenario: Any) -> dict[str, str]:
    """Return a scenario's value on every axis a claim can name."""
    return {**classify(scenario).axis_values(), WRITER_AXIS: compute_writer_kind(scenario)}


@attrs.define
class Coverage:
    """Cases run and disagreeing, per axis value, per boundary class, per class."""

    axes: dict[str, dict[str, list[int]]] = attrs.Factory(dict)
    boundary: dict[str, list[int]] = attrs.Factory(dict)
    classes: dict[str, list[int]] = attrs.Factory(dict)

    def add(self, scenario: Any, bad: bool) -> str:
        c = classify(scenario)
        for axis, value in compute_axis_values(scenario).items():
            cell = self.axes.setdefault(axis, {}).setdefault(value, [0, 0])
            cell[0] += 1
            cell[1] += bad
        for b in compute_boundary_classes(scenario, evaluate_scenario(scenario)):
            cell = self.boundary.setdefault(b, [0, 0])
            cell[0] += 1
            cell[1] += bad
        cell = self.classes.setdefault(c.label(), [0, 0])
        cell[0] += 1
        cell[1] += bad
        return c.label()


def run_adapter_conformance(adapter: EngineAdapter, rules: str, examples: int = 300, seed: int = 0,
                            stop_after: int | None = None, shrink: bool = True) -> dict[str, Any]:
    """Run the explain vectors of a rule set, then a Hypothesis search over the claimed classes, against an
    adapter; return the report (coverage table, disagreements with expected vs actual, uncovered claims).

    A disagreement found by the search is shrunk by Hypothesis to a minimal scenario and reported as a
    runnable `kvspec explain` command; `shrink=False` reports the first one found as it was drawn (the verdict is
    the same; shrinking replays the adapter hundreds of times: ≈ 3/4 of a known-bad port's run, measured).
    `stop_after` k: stop at the k-th vector disagreement (no search; the report says it stopped early).
    """
    try:
        import hypothesis
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
    except ImportError as exc:
        raise SpecError("conform-deps", f"kvspec conform --adapter needs hypothesis ({exc}): "
                                        "pip install 'kvspec[conform]'") from None


    t0 = time.perf_counter()
    claims = _claimed(adapter)
    cov = Coverage()
    bad: list[dict[str, Any]] = []
    run = skipped = 0
    stopped = False
    for path, inp in iterate_vector_inputs(rules):
        if stop_after is not None and len(bad) >= stop_after:
            stopped = True
            break
        sc = decode_scenario(inp)
        if not _in_claims(claims, compute_axis_values(sc)):
            skipped += 1
            continue
        run += 1
        diff = compare_adapter(adapter, sc)
        label = cov.add(sc, diff is not None)
        if diff is not None:
            bad.append({"source": "vector", "vector": path, "class": label, **diff,
                        "command": format_explain_command(sc), "input": encode_scenario(sc)})
    # the classes this rule set can express, within the claims: the search draws from them
    expressible = [c for c in CLASSES if _in_claims(claims, c.axis_values())
                   and compute_class_scenarios(c, rules, count=1)]
    found: list[tuple[Any, dict[str, Any]]] = []
    searched = [0]

    @st.composite
    def scenarios(d: Any) -> Any:
        draw = HypothesisDraw(d)
        sc = draw_scenario(draw, draw.choice(expressible), rules)
        hypothesis.assume(sc is not None)
        return sc

    # from Hypothesis's default profile, not whatever profile the caller loaded: a seed gives the same search in
    # the CLI, in pytest under any HYPOTHESIS_PROFILE, and in the docs
    default = settings.get_profile("default")
    @settings(default, max_examples=max(examples, 1), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), derandomize=False, print_blob=False,
              phases=[p for p in default.phases if shrink or p != hypothesis.Phase.shrink])
    @hypothesis.seed(seed)
    @given(scenarios())
    def search(sc: Any) -> None:
        diff = compare_adapter(adapter, sc)
        if diff is not None:
            found[:] = [(sc, diff)]
            raise AssertionError(diff["fields"])
        if not found:  # scenarios run before the first disagreement (not the shrinker's replays) count as covered
            searched[0] += 1
            cov.add(sc, False)

    if expressible and examples > 0 and not stopped:
        with contextlib.suppress(AssertionError), _pinned_local_constants():
            search()
    shrunk = None
    if found:
        sc, diff = found[0]
        label = cov.add(sc, True)
        shrunk = {"source": "search", "shrunk": shrink, "class": label, **diff, "command": format_explain_command(sc),
                  "input": encode_scenario(sc)}
    uncovered = [] if stopped else _uncovered_claims(claims, cov, rules)
    n_bad = len(bad) + (shrunk is not None)
    common = sorted(b for b, (n, k) in cov.boundary.items() if n_bad and k == n_bad and n > k)
    failing_axes = {axis: sorted(v for v, (n, b) in vals.items() if b) for axis, vals in cov.axes.items()
                    if any(b for _, b in vals.values()) and any(not b for _, b in vals.values())}
    return {"adapter": adapter.name, "rules": rules, "claims": {a: sorted(v, key=_axis_order) for a, v in claims.items()},
            "vectors": run, "vectors_not_claimed": skipped, "vector_disagreements": bad,
            "searched": searched[0], "search_disagreement": shrunk,
            "coverage": {"axes": cov.axes, "boundary": cov.boundary, "classes": cov.classes,
                         "classes_total": len(CLASSES), "classes_expressible": len(expressible)},
            "uncovered_claims": uncovered, "disagreeing_only_where": failing_axes, "every_disagreement_has": common,
            "stopped_early": stopped, "ok": not bad and shrunk is None and not uncovered and not stopped,
            "seconds": round(time.perf_counter() - t0, 2)}


# the modules whose literals (block sizes, units, limits, the generator's own numbers) seed the search's constants
SEARCH_CONSTANTS = ("kvspec.spec.geometry", "kvspec.spec.limits", "kvspec.spec.presets", "kvspec.spec.rules",
                    "kvspec.spec.schedule", "kvspec.spec.store", "kvspec.spec.lookup", "kvspec.checks.conform.coverage")


@contextlib.contextmanager
def _pinned_local_constants() -> Any:
    """Run the block with Hypothesis's pool of *local* constants pinned to SEARCH_CONSTANTS' literals. Hypothesis (6.131
    on) draws about one integer in 20 from the literals of the non-test modules loaded from outside site-packages:
    which of kvspec's modules happened to be imported — and whether kvspec is a checkout or an installed wheel —
    changed a seeded search (found when hoisting an import sent docs/porting.md's search from "87 scenarios, a
    disagreement" to "100, none"). Pinned, a seed is one search everywhere; the literals stay (an empty pool found the
    legacy loader's bug less often). Hypothesis's internals: a version without them runs the block as is."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import constants_from_module
    except ImportError:  # pragma: no cover - an older or newer Hypothesis
        yield
        return
    saved, cache = getattr(providers, "_get_local_constants", None), getattr(providers, "CONSTANTS_CACHE", None)
    local = getattr(providers, "_local_constants", None)
    if saved is None or cache is None or local is None:  # pragma: no cover
        yield
        return
    pinned = type(local)()
    for name in SEARCH_CONSTANTS:
        pinned |= constants_from_module(importlib.import_module(name))
    providers._get_local_constants = lambda: pinned
    cache.cache.clear()  # the permitted constants per choice type, local ones included
    try:
        yield
    finally:
        providers._get_local_constants = saved
        cache.cache.clear()


def _uncovered_claims(claims: Mapping[str, Collection[str]], cov: Coverage, rules: str) -> list[str]:
    """Return each claimed axis value and each claimed, expressible class the run left without a case."""
    out = [f"{axis}={v}" for axis, vals in claims.items() for v in sorted(vals)
           if cov.axes.get(axis, {}).get(v, [0, 0])[0] == 0]
    for c in CLASSES:
        if _in_claims(claims, c.axis_values()) and c.label() not in cov.classes \
                and compute_class_scenarios(c, rules, count=1):
            out.append(f"class {c.label()}")
    return out


def iterate_vector_inputs(rules: str) -> Iterable[tuple[str, dict[str, Any]]]:
    """Yield (path, input) of the explain vectors of a rule set (scenarios from stored requests): the shipped
    files (a wheel's package data or a checkout's vectors/), else generated (the tests keep them equal)."""

    root = find_vector_cases(rules)
    if root is not None:
        for case in sorted(root.glob("*/*")):
            inp = json.loads((case / "input.json").read_text())
            if "stored" not in inp:
                yield str(case / "input.json"), inp
        return
    for runner, handler, suite, case_name, inp, _ in compute_cases(rules):
        if runner == "explain" and "stored" not in inp:
            yield f"(generated) {rules}/{runner}/{handler}/{suite}/{case_name}", inp


def _short(value: Any, limit: int = 160) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(value)} items)"


def _first_difference(want: list[Any], got: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            return f"first difference at entry {i}: expected {a}, got {b}"
    return f"expected {len(want)} entries, got {len(got)}"


def format_disagreement(d: dict[str, Any]) -> list[str]:
    """Return the lines of one disagreement: where it comes from, each field expected vs actual, the rerun."""
    where = f"vector {d['vector']}" if d["source"] == "vector" else \
        "search (shrunk to a minimal scenario)" if d["shrunk"] else "search (as drawn, not shrunk: --no-shrink)"
    out = [f"  [{d['class']}] {where}"]
    if "raised" in d:
        out.append(f"    the adapter raised {d['raised']}")
        out += ["      " + line for line in d["traceback"].rstrip().splitlines()]
    for f in d.get("expected", {}):
        want, got = d["expected"][f], d["actual"][f]
        out.append(f"    {f}: expected {_short(want)}, got {_short(got)}")
        if isinstance(want, list) and isinstance(got, list) and (len(want) > 3 or len(got) > 3):
            out.append(f"      ({_first_difference(want, got)})")
    out.append(f"    rerun: {d['command']}")
    return out


def format_adapter_report(rep: dict[str, Any]) -> str:
    """Return the readable report of `kvspec conform --adapter`."""
    bad, found = rep["vector_disagreements"], rep["search_disagreement"]
    searched = (", a disagreement (shrunk)" if found["shrunk"] else ", a disagreement (as drawn: --no-shrink)") \
        if found else ", none disagree"
    lines = [f"kvspec conform --adapter {rep['adapter']} against rule set {rep['rules']} ({rep['seconds']} s)",
             f"  vectors: {rep['vectors']} scenarios run ({rep['vectors_not_claimed']} outside the adapter's claims), "
             f"{len(bad)} disagree",
             f"  search: {rep['searched']} scenarios over {rep['coverage']['classes_expressible']} classes"
             + searched]
    if rep["claims"]:
        lines.append("  claims: " + "; ".join(f"{a} in {v}" for a, v in rep["claims"].items()))
    lines.append("coverage (scenarios run / disagreeing):")
    for axis, vals in rep["coverage"]["axes"].items():
        cells = "  ".join(f"{v}: {n}/{b}" for v, (n, b) in sorted(vals.items(), key=lambda kv: _axis_order(kv[0])))
        lines.append(f"  {axis:<10} {cells}")
    cells = "  ".join(f"{v}: {n}/{b}" for v, (n, b) in sorted(rep["coverage"]["boundary"].items()))
    lines.append(f"  {'boundary':<10} {cells}")
    cov = rep["coverage"]
    lines.append(f"  classes    {len(cov['classes'])} of {cov['classes_total']} run ({cov['classes_expressible']} "
                 f"claimed and expressible under {rep['rules']})")
    if rep["uncovered_claims"]:
        shown = ", ".join(rep["uncovered_claims"][:8])
        more = f" and {len(rep['uncovered_claims']) - 8} more" if len(rep["uncovered_claims"]) > 8 else ""
        lines.append(f"  NOT COVERED though claimed: {shown}{more}")
    everything = bad + ([found] if found else [])
    if everything:
        lines.append(f"disagreements ({min(SHOWN, len(bad))} of {len(bad)} vector disagreements shown"
                     + (", --json for all" if len(bad) > SHOWN else "") + "):")
        for d in bad[:SHOWN]:
            lines += format_disagreement(d)
        if found:
            lines += format_disagreement(found)
        classes = sorted({d["class"] for d in everything})
        lines.append(f"failing classes ({len(classes)}): {', '.join(classes[:10])}"
                     + (f" and {len(classes) - 10} more" if len(classes) > 10 else ""))
        for axis, vals in rep["disagreeing_only_where"].items():
            lines.append(f"  disagreements only where {axis} is {', '.join(vals)}")
        if rep["every_disagreement_has"]:
            lines.append(f"  every disagreement has: {', '.join(rep['every_disagreement_has'])}")
    if rep["ok"]:
        lines.append("result: conforms on every claimed class")
    elif everything:
        lines.append("result: DISAGREEMENT (exit 1)")
    else:
        lines.append("result: claimed classes NOT COVERED (exit 1)")
    return "\n".join(lines)


def _axis_order(value: str) -> tuple[int, str]:
    return (int(value), "") if value.isdigit() else (0, value)
