"""`kvspec conform vllm`: the ``vllm-0.33.0`` rule set against vLLM 0.33.0's own code, field by field.

Scenarios are generated from a seed (no Hypothesis: the same seed gives the same set on every
machine); each is evaluated by the spec and answered by the oracle (``vllm_oracle.py``); the report
counts agreement per field — refusal, stored objects, hit, tail boundaries, load keys — and keeps
the first disagreements, each with a runnable ``kvspec explain`` command.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import attrs

from kvspec.checks.conform.adapters import format_explain_command
from kvspec.checks.conform.vllm_oracle import MODEL, Engine, Refused, compute_answer, load_vllm, scenario_tokens
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel, compute_lcm_span, compute_spans
from kvspec.spec.keys import GRAMMAR_VLLM, KEY_GRAMMARS, compute_lookahead_chain
from kvspec.spec.limits import compute_longest_prompt
from kvspec.spec.plan import plan_load_keys
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import VLLM_0_33, compute_lookahead
from kvspec.spec.scenario import Scenario, StoredRequest, compute_stored_objects, evaluate_scenario
from kvspec.spec.store import compute_rank_objects, compute_rule_store, compute_visible
from kvspec.spec.types import Tokens

RULES = VLLM_0_33
FIELDS = ("refusal", "stored", "hit", "tails", "load_keys")
DCPS = (1, 2, 4, 8, 16)
MAX_TOKENS = 60_000  # prompts are drawn around multiples of L, kept below this


@attrs.frozen(kw_only=True)
class Case:
    """One generated scenario, or a geometry the spec itself refuses (then only the refusal is compared)."""

    scenario: Scenario | None
    geometry_args: dict[str, Any]
    spec_error: str | None


def _draw_geometry(rng: random.Random) -> dict[str, Any]:
    d = rng.choice(DCPS)
    u = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256, rng.randint(1, 256)])
    def q() -> int:
        return rng.choice([1, 1, 2, 3, 4, rng.randint(1, 16)])

    eagle = rng.random() < 0.5
    shape = rng.choice(["att+mamba", "att+mamba", "att+draft+mamba", "att+mamba+mamba", "att+att+mamba",
                        "att", "mamba"])
    qa = q()
    groups: list[tuple[str, int, bool]] = []
    if shape.startswith("att"):
        groups.append(("attention", qa * u, eagle))
    if shape == "att+draft+mamba":
        groups.append(("attention", qa * u, rng.random() < 0.5))
    if shape == "att+att+mamba":
        groups.append(("attention", q() * u, rng.random() < 0.3))
    if "mamba" in shape:
        groups.append(("mamba", q() * u, False))
    if shape == "att+mamba+mamba":
        groups.append(("mamba", q() * u, False))
    if shape == "mamba":  # a lone Mamba group: u = b (vLLM accepts) or u = b/2 (vLLM refuses)
        d, b = rng.choice((1, 2)), groups[0][1]
        u = b if rng.random() < 2 / 3 else max(b // 2, 1)
        groups = [("mamba", b // u * u, False)]
    rng.shuffle(groups)
    return {"unit": u, "dcp": d, "groups": groups, "retention": rng.choice(["replay", "dense"])}


def _draw_case(rng: random.Random, rules: str = RULES) -> Case:
    args = _draw_geometry(rng)
    try:
        g = Geometry(unit=args["unit"], groups=tuple(Group(kind=k, block_size=b, eagle=e) for k, b, e in args["groups"]),
                     parallel=Parallel(dcp=args["dcp"]), retention=args["retention"])
    except SpecError as err:
        return Case(scenario=None, geometry_args=args, spec_error=err.rule)
    lcm, u = compute_lcm_span(g), g.unit
    # within spec/limits.py (3 stored requests, up to 3 evicted shards on every rank): an input limit of the
    # spec, not a configuration vLLM refuses, so it must not show up as a refusal to compare
    spans = compute_spans(g)
    cap = compute_longest_prompt(g.parallel.dcp, spans, 3, 3 * g.parallel.dcp) - 2 * u
    top = max(min(MAX_TOKENS, 3 * lcm + 3 * u, cap), 2)

    def length() -> int:
        if rng.random() < 0.6:
            k = rng.randint(0, max(1, top // lcm))
            return max(1, min(top, k * lcm + rng.randint(-3 * u, 3 * u)))
        return rng.randint(1, top)

    n = length()
    stored = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        p = rng.choice([n, n, length(), n + rng.randint(0, 2 * u)])
        s = rng.choice([min(p, n), min(p, n), rng.randint(0, min(p, n))])
        stored.append(StoredRequest(prompt=p, shared=s))
    try:
        sc = Scenario(geometry=g, prompt=n, stored=tuple(stored), rules=rules)
    except SpecError as err:
        return Case(scenario=None, geometry_args=args, spec_error=err.rule)
    if rng.random() < 0.3:  # evict a few shards (one rank, or every rank) of what was stored
        objs = sorted(compute_stored_objects(sc))
        if objs:
            picks = rng.sample(objs, min(len(objs), rng.randint(1, 3)))
            if rng.random() < 0.5:
                picks = sorted(compute_rank_objects(g, {(x, t) for x, t, _ in picks}))
            sc = attrs.evolve(sc, evicted=frozenset(picks))
    return Case(scenario=sc, geometry_args=args, spec_error=None)


def iterate_cases(count: int, seed: int, rules: str = RULES) -> Iterator[Case]:
    """Yield `count` generated cases under a rule set, then the worked examples (kimi-k3-dcp8 with and without a
    draft group). The draws do not depend on the rule set: every rule set meets the same scenarios."""
    rng = random.Random(seed)
    for _ in range(count):
        yield _draw_case(rng, rules)
    for preset in ("kimi-k3-dcp8", "kimi-k3-dcp8-draft"):
        g = get_preset(preset)
        yield Case(scenario=Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),),
                                     rules=rules), geometry_args={"preset": preset}, spec_error=None)


def format_command(sc: Scenario) -> str:
    """Return a runnable `kvspec explain` command for a scenario (every stored request and eviction)."""
    return format_explain_command(sc)


def compare_case(case: Case, v: Any) -> dict[str, bool]:
    """Return per-field agreement of the spec and vLLM on one case (only `refusal` when either refuses)."""
    if case.scenario is None:
        args = case.geometry_args
        g_args = dict(unit=args["unit"], dcp=args["dcp"], groups=args["groups"])
        try:
            Engine(_unchecked_geometry(g_args), v)
        except Refused:
            return {"refusal": True}
        return {"refusal": False}
    sc = case.scenario
    ans = compute_answer(sc, v)
    if ans.refused is not None:
        return {"refusal": False}
    g = sc.geometry
    out = evaluate_scenario(sc)
    spec_stored: set[Any] = set()
    rs = sc.rules
    lam = compute_lookahead(rs, g)  # the spec's λ: the keys below are hashed as the spec says they are
    for r in sc.stored:
        spec_stored |= compute_visible(compute_rule_store(rs, g, Tokens(r.prompt)), Tokens(r.shared), lam)
    tokens, _ = scenario_tokens(sc)
    chain = compute_lookahead_chain(tokens, g.unit, lam)
    render = KEY_GRAMMARS[GRAMMAR_VLLM]
    spec_keys = tuple((rank, render(k)) for rank, k in plan_load_keys(g, out.load, chain, MODEL))
    spec_keys = tuple(sorted(spec_keys, key=lambda x: x[0]))  # rank-major, plan order within a rank
    return {"refusal": True, "stored": frozenset(spec_stored) == ans.stored, "hit": out.hit_length == ans.hit,
            "tails": tuple(out.tails) == tuple(ans.tails), "load_keys": spec_keys == ans.load_keys}


def _unchecked_geometry(args: dict[str, Any]) -> Any:
    """Return a duck-typed geometry for the oracle when kvspec's own validation refused the values."""
    groups = tuple(SimpleNamespace(kind=k, block_size=b, eagle=e) for k, b, e in args["groups"])
    return SimpleNamespace(unit=args["unit"], groups=groups, parallel=SimpleNamespace(dcp=args["dcp"], pcp=1),
                           retention="replay")


def run_conformance(count: int = 2000, seed: int = 0, rules: str = RULES) -> dict[str, Any]:
    """Return the conformance report of a rule set against vLLM 0.33.0's code: cases, per-field agreement
    counts, the first disagreements."""
    v = load_vllm()
    t0 = time.perf_counter()
    agree = dict.fromkeys(FIELDS, 0)
    compared = dict.fromkeys(FIELDS, 0)
    kinds = {"both-accept": 0, "both-refuse": 0}
    bad: list[dict[str, Any]] = []
    n = 0
    for case in iterate_cases(count, seed, rules):
        n += 1
        res = compare_case(case, v)
        for f, ok in res.items():
            compared[f] += 1
            agree[f] += ok
        if case.scenario is None and res["refusal"]:
            kinds["both-refuse"] += 1
        elif case.scenario is not None and res["refusal"]:
            kinds["both-accept"] += 1
        if not all(res.values()) and len(bad) < 10:
            bad.append({"fields": [f for f, ok in res.items() if not ok],
                        "case": None if case.scenario else case.geometry_args,
                        "command": format_command(case.scenario) if case.scenario else None})
    return {"rules": rules, "vllm": metadata.version("vllm"), "seed": seed, "cases": n, "compared": compared,
            "agree": agree,
            "kinds": kinds, "disagreements": bad, "ok": all(agree[f] == compared[f] for f in FIELDS),
            "seconds": round(time.perf_counter() - t0, 1)}


def format_report(rep: dict[str, Any]) -> str:
    """Return the readable conformance report."""
    out = [f"kvspec conform vllm: rule set {rep['rules']} vs vLLM {rep['vllm']} (its own code), seed {rep['seed']}, "
           f"{rep['cases']} cases ({rep['kinds']['both-accept']} accepted by both, "
           f"{rep['kinds']['both-refuse']} refused by both), {rep['seconds']} s"]
    for f in FIELDS:
        c, a = rep["compared"][f], rep["agree"][f]
        out.append(f"  {f:<10} {a:>6} / {c:<6} agree ({100.0 * a / c if c else 100.0:.2f}%)")
    for d in rep["disagreements"]:
        out.append(f"  DISAGREE on {', '.join(d['fields'])}: " + (d["command"] or f"the geometry {d['case']}"))
    out.append("result: " + ("100% agreement" if rep["ok"] else "DISAGREEMENT (exit 1)"))
    return "\n".join(out)
