"""`kvspec vectors --out DIR`: language-neutral test vectors, each an input and the spec's expected output.

Layout (after consensus-specs' test formats): DIR/<rule set>/<runner>/<handler>/<suite>/<case>/ with
`input.json`, `expected.json` and `meta.json` (format version, kvspec version, rule set, runner,
handler, suite, case). Every file is deterministic JSON (sorted keys, one trailing newline), so
regenerating the vectors reproduces them byte for byte. Runners:

* explain/outcome — input: a scenario (schemas/scenario.schema.json); expected: the explain result
  without its echoed input (schemas/outcome.schema.json). Suites: worked (the presets' worked
  examples), boundaries (prompts around every span multiple of a small DCP geometry, resends and
  shared prefixes), exhaustive-sample (every k-th scenario of make verify's scope), mutant-counterexamples
  (for each known bug, the first scenario of the scope it fails on, with what the rule set does),
  coverage (checks/conform/coverage.py: every class of (D, I > 1, PCP > 1, drafter, group mix) the rule set can
  express, three seeded cases each: a resend, a long prompt up to 10⁶ tokens, two stored requests with a
  longer lookup and an eviction), and for `legacy` the #53324 counterexample (a planned key that is not
  present).
* failure/safe-boundary — input: a scenario and per-block load results; expected: the safe boundary,
  what each attention group loaded, and the retry cap (spec/failure.py).
* keys/render — input: token ids, unit, the key fields and a (group, boundary); expected: the chain hash
  at that boundary and the key in kvspec's grammar and in vLLM 0.33.0's.
"""

from __future__ import annotations

import functools
import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from kvspec import __version__
from kvspec.checks.conform.coverage import iterate_coverage
from kvspec.checks.output import replace_vectors_tree
from kvspec.checks.rulesets import RULE_CHECKS, VECTORS_COUNTEREXAMPLES, get_rule_checks, list_rules
from kvspec.checks.verify.exhaustive import iterate_all
from kvspec.checks.verify.mutants import MUTANTS, hunt
from kvspec.spec.errors import SpecError
from kvspec.spec.failure import compute_loaded_prefix, compute_retry_cap, compute_safe_boundary
from kvspec.spec.geometry import Geometry, compute_group_ids, compute_lcm_span, make_geometry
from kvspec.spec.keys import KEY_GRAMMARS, StoreKey, compute_hash_at, compute_lookahead_chain
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import LEGACY, check_config, get_rules
from kvspec.spec.scenario import (
    RULE_DECODED,
    Scenario,
    StoredRequest,
    encode_outcome,
    encode_scenario,
    evaluate_scenario,
)
from kvspec.spec.types import Boundary

FORMAT = 1
SAFE_RULES = list_rules("vectors")  # checks/rulesets.py: the rule sets with every suite
Case = tuple[str, str, str, str, dict[str, Any], dict[str, Any]]  # runner, handler, suite, case, input, expected


def _outcome(sc: Scenario) -> dict[str, Any]:
    out = encode_outcome(sc, evaluate_scenario(sc))
    out.pop("input")
    return out


def _explain(suite: str, name: str, sc: Scenario) -> Case:
    return ("explain", "outcome", suite, name, encode_scenario(sc), _outcome(sc))


def _resend(g: Geometry, p: int, rules: str, shared: int | None = None, n: int | None = None) -> Scenario:
    return Scenario(geometry=g, prompt=n or p, stored=(StoredRequest(prompt=p, shared=p if shared is None else shared),),
                    rules=rules)


def _admits(rules: str, g: Geometry) -> bool:
    """Return whether the rule set's configuration rules admit the geometry (a suite takes the geometries it admits)."""
    try:
        check_config(get_rules(rules), g)
    except SpecError:
        return False
    return True


WORKED = (("kimi-k3-dcp8", 15000), ("kimi-k3-dcp8-draft", 15000), ("tiny-dcp2", 19), ("small-dcp2", 57),
          ("small-dcp4", 150), ("tiny-two-mamba", 29), ("kimi-k3-sglang-dcp8", 30000), ("tiny-sglang-dcp2", 19))
# the boundaries suite's geometry: the first of these the rule set admits (vLLM's shape; SGLang's whole pages)
BOUNDARY_GEOMETRIES = (make_geometry(4, [("attention", 16, True), ("mamba", 16, False)], dcp=2),
                       make_geometry(8, [("attention", 8, False), ("mamba", 32, False)], dcp=2))


def _worked(rules: str) -> Iterator[Case]:
    for preset, p in WORKED:
        if _admits(rules, get_preset(preset)):
            yield _explain("worked", f"{preset}-{p}", _resend(get_preset(preset), p, rules))


def _boundaries(rules: str) -> Iterator[Case]:
    g = next(g for g in BOUNDARY_GEOMETRIES if _admits(rules, g))
    lcm, u = compute_lcm_span(g), g.unit
    for k in (1, 2, 3):
        for d in (-u, -1, 0, 1, u):
            p = k * lcm + d
            yield _explain("boundaries", f"resend-{p}", _resend(g, p, rules))
            yield _explain("boundaries", f"shared-{p}-{p - u}", _resend(g, p, rules, shared=p - u))
            yield _explain("boundaries", f"longer-lookup-{p}", _resend(g, p, rules, n=p + lcm))


def _exhaustive_sample(rules: str, every: int = 3001, cap: int = 120) -> Iterator[Case]:
    for k, sc in enumerate(itertools.islice(iterate_all(rules=rules, every=every), cap)):
        yield _explain("exhaustive-sample", f"{k:04d}", sc)


@functools.cache
def _mutant_scenarios() -> tuple[tuple[str, Scenario], ...]:
    """Return each scenario mutant's first counterexample in the mutant-hunt order (one hunt for every rule set)."""
    out = []
    for m in MUTANTS:
        if m.closure:  # closure mutants are caught on failed loads (the failure vectors), not by a scenario
            continue
        _, sc, _ = hunt(m, iterate_all(dcps=(2, 8, 4, 1)))
        if sc is not None:
            out.append((m.name, sc))
    return tuple(out)


def _mutant_counterexamples(rules: str) -> Iterator[Case]:
    for name, sc in _mutant_scenarios():
        if _admits(rules, sc.geometry):  # the bug's scenario, where the rule set admits it
            yield _explain("mutant-counterexamples", name, attrs.evolve(sc, rules=rules))


FINISHED_GEOMETRIES = (make_geometry(4, [("attention", 16, True), ("mamba", 16, False)], dcp=2),
                       make_geometry(4, [("attention", 16, True), ("mamba", 16, False)], dcp=2, retention="dense"),
                       make_geometry(8, [("attention", 8, True)], dcp=1),
                       make_geometry(4, [("attention", 8, False), ("mamba", 16, False)], dcp=2))


def _finished(rules: str) -> Iterator[Case]:
    """Writers that decoded before finishing, with and without save_decode_cache, and readers continuing their
    conversation through every output: what 0.34.0's deferred saves and both releases' decode-phase saves add."""
    for gi, g in enumerate(FINISHED_GEOMETRIES):
        if not _admits(rules, g):
            continue
        lcm = compute_lcm_span(g)
        for p in (lcm - 1, lcm, 2 * lcm):
            for o in (1, 2, 2 * lcm + 3):
                for sdc in (False, True):
                    try:
                        sc = Scenario(geometry=g, prompt=p + o + g.unit, rules=rules,
                                      stored=(StoredRequest(prompt=p, shared=p + o, decoded=o, save_decode_cache=sdc),))
                    except SpecError as err:  # a rule set without decode-phase saves (the PR's store rule) refuses
                        if err.rule != RULE_DECODED:  # them; nothing else may be skipped
                            raise
                        continue
                    yield _explain("finished", f"g{gi}-p{p}-o{o}{'-decode-cache' if sdc else ''}", sc)


def _legacy() -> Iterator[Case]:
    yield _explain("counterexample", "kimi-k3-dcp8-15000", _resend(get_preset("kimi-k3-dcp8"), 15000, LEGACY))
    yield _explain("counterexample", "small-dcp2-57", _resend(get_preset("small-dcp2"), 57, LEGACY))
    yield _explain("worked", "no-dcp-safe-19", _resend(make_geometry(1, [("attention", 4, True), ("mamba", 4, False)]),
                                                       19, LEGACY))


def _coverage(rules: str) -> Iterator[Case]:
    for name, sc in iterate_coverage(rules):
        yield _explain("coverage", name, sc)


def _failure(rules: str, cap: int = 60) -> Iterator[Case]:
    n = 0
    for sc in iterate_all(dcps=(1, 2, 4), evict=False, rules=rules, every=97):
        if n >= cap:
            break
        out = evaluate_scenario(sc)
        if out.hit_length <= 0 or not out.load:
            continue
        g, h = sc.geometry, out.hit_length
        for j in sorted({0, len(out.load) // 2, len(out.load) - 1}):
            ok = tuple(i != j for i in range(len(out.load)))
            safe = compute_safe_boundary(g, out.present, h, out.load, ok)
            expected = {"hit_length": h, "safe_boundary": safe, "retry_cap": compute_retry_cap(1, safe),
                        "attention_loaded": [compute_loaded_prefix(g, a, h, out.load, ok)
                                             for a in compute_group_ids(g, "attention")]}
            yield ("failure", "safe-boundary", "single-block", f"{n:03d}-fail-{j}",
                   {"scenario": encode_scenario(sc), "load_ok": list(ok)}, expected)
        n += 1


def _keys(lookahead: int = 0) -> Iterator[Case]:
    tokens = [(7 * i + 3) % 1000 for i in range(64)]
    for unit, boundary in ((4, 16), (4, 64 - 4 * lookahead), (16, 48), (1, 1)):
        chain = compute_lookahead_chain(tokens, unit, lookahead)
        h = compute_hash_at(chain, unit, Boundary(boundary)).hex()
        extra = {"lookahead": lookahead} if lookahead else {}
        for rank, group, model, prefix in ((0, 0, "kimi-k3", ""), (3, 1, "org/model@rev", "bf16"), (7, 2, "a%b", "x@y")):
            key = StoreKey(model=model, tp_rank=rank, pcp_rank=0, dcp_rank=rank, pp_rank=0, group=group, hash_hex=h,
                           cache_prefix=prefix)
            yield ("keys", "render", "explicit-tokens", f"u{unit}-t{boundary}-r{rank}-g{group}",
                   {"tokens": tokens, "unit": unit, "boundary": boundary, "model": model, "cache_prefix": prefix,
                    "tp_rank": rank, "pcp_rank": 0, "dcp_rank": rank, "pp_rank": 0, "group": group, **extra},
                   {"hash_hex": h, **{f"key_{name.replace('-', '_').replace('.', '_')}": render(key)
                                      for name, render in sorted(KEY_GRAMMARS.items())}})


def compute_cases(rules: str) -> Iterator[Case]:
    """Yield every vector case of one rule set (checks/rulesets.py says which suites)."""
    row = get_rule_checks(rules)
    if row.vectors == VECTORS_COUNTEREXAMPLES:
        yield from _legacy()
        return
    yield from _worked(rules)
    yield from _boundaries(rules)
    yield from _finished(rules)
    yield from _exhaustive_sample(rules)
    yield from _mutant_counterexamples(rules)
    yield from _coverage(rules)
    yield from _failure(rules)
    if row.key_vectors:  # key strings from explicit token ids, at the rule set's λ (its lookahead when it has one)
        yield from _keys(get_rules(rules).lookahead)


def dump_json(value: Any) -> str:
    """Return the deterministic text of a vector file."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def write_vectors(out: Path) -> dict[str, int]:
    """Write every rule set's vectors into the folder `out` (created; it must not hold a case already);
    return cases per rule set."""
    counts: dict[str, int] = {}
    for rules in (r.rules for r in RULE_CHECKS if r.vectors):
        n = 0
        for runner, handler, suite, case, inp, expected in compute_cases(rules):
            d = out / rules / runner / handler / suite / case
            d.mkdir(parents=True, exist_ok=False)
            meta = {"format": FORMAT, "kvspec": __version__, "rules": rules, "runner": runner, "handler": handler,
                    "suite": suite, "case": case}
            (d / "meta.json").write_text(dump_json(meta))
            (d / "input.json").write_text(dump_json(inp))
            (d / "expected.json").write_text(dump_json(expected))
            n += 1
        counts[rules] = n
    return counts


def compare_trees(a: Path, b: Path) -> list[str]:
    """Return the relative paths that differ between two vector trees (missing on one side or other bytes)."""
    fa = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    fb = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    diff = sorted(str(p) for p in fa ^ fb)
    diff += sorted(str(p) for p in fa & fb if (a / p).read_bytes() != (b / p).read_bytes())
    return diff


def run_vectors(out: str, check: bool = False, force: bool = False) -> int:
    """Write the vectors (or, with check, regenerate them elsewhere and compare with `out`); return the exit code.

    Writing never deletes a file that is not a vector (checks/output.py: a new or empty folder, or an
    existing vectors tree with `force`)."""

    if not check:
        counts: dict[str, int] = {}
        replace_vectors_tree(Path(out), lambda d: counts.update(write_vectors(d)), force=force)
        print(f"kvspec vectors: {sum(counts.values())} cases in {out} "
              + ", ".join(f"{r}: {n}" for r, n in counts.items()))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write_vectors(Path(tmp) / "v")
        diff = compare_trees(Path(tmp) / "v", Path(out))
    for p in diff[:20]:
        print(f"differs: {p}")
    if len(diff) > 20:
        print(f"... and {len(diff) - 20} more")
    print(f"kvspec vectors --check: {len(diff)} files differ from {out}" if diff else
          f"kvspec vectors --check: {out} is what this kvspec generates")
    return 1 if diff else 0
