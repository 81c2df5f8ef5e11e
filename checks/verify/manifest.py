"""The checks of `make verify`, as data: one value per table row.

A check is a theorem (Z3), an exhaustive run of the registry over a named ``Scope``, a link run
(closed form == executable spec), a failure-closure run, or a mutant hunt. Each has an id, a
statement, an expected result, a budget (its expected seconds on an idle 2-core machine, which only
orders the work: longest first), a ``fast`` flag (part of ``verify --fast``), and splits into parts
that run on any core; ``render`` turns the parts' results into one typed ``Row``. Adding a check is
adding one value to ``compute_manifest``'s list (a property row: one ``Expect`` in its rule set's row of
checks/rulesets.py).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import attrs

from kvspec.checks.conform.adapters import format_explain_command
from kvspec.checks.rulesets import EXHAUSTIVE_FULL, EXHAUSTIVE_VERIFY, PROPERTY_HOLDS, RULE_CHECKS
from kvspec.checks.verify.closed_form import VLLM_RULES, Params
from kvspec.checks.verify.efficiency import PROPERTIES, Memo
from kvspec.checks.verify.exhaustive import (
    SCOPE_FAILURE,
    SCOPE_MUTANTS,
    SCOPE_SCHEDULES_0_34,
    SCOPE_SCHEDULES_VLLM,
    SCOPE_SMALL,
    Scope,
    compute_registry_scope,
    iterate_geometries,
)
from kvspec.checks.verify.link import (
    LINK_SCOPE,
    LINK_SCOPE_BEST,
    LINK_SCOPE_DRAFT,
    LINK_SCOPE_SCHEDULES,
    LinkScope,
    compare,
    compare_best,
    compare_failure,
    compare_schedule,
)
from kvspec.checks.verify.mutants import MUTANTS, Mutant, hunt
from kvspec.checks.verify.prove import compute_theorems, prove
from kvspec.spec.invariants import (
    REGISTRY,
    compute_failure_violations,
    compute_keyed_violations,
    compute_shared,
    compute_shared_violations,
    compute_verdict_key,
)
from kvspec.spec.limits import compute_longest_prompt
from kvspec.spec.rules import PR53324, STORE_PR53324, get_rules
from kvspec.spec.scenario import evaluate_scenario

FAST_THEOREMS = ("I-1/2", "I-6", "CONTENT-KEY", "CONTENT-KEY@legacy-hashes", "LEMMA-MAMBA", "I-14", "I-18", "I-20",
                 "LEGACY-D1-SAFE", "LEGACY-I-20")
CHUNKS = 12  # an exhaustive scope is split into this many parts (geometries k, k + 12, ...)
MAX_FAILURES = 3  # failures a row keeps


EXHAUSTIVE_INPUTS = "exhaustive_scenarios"  # the registry's exhaustive rows' scenarios (a report total)
LINK_INPUTS = "link_inputs"  # the closed-form links' inputs (a report total)


class Method(enum.StrEnum):
    """How a row was checked (its JSON `method`)."""

    Z3 = "z3"
    EXHAUSTIVE = "exhaustive"
    HYPOTHESIS = "hypothesis"
    MUTANT = "mutant"


@attrs.frozen(kw_only=True)
class Row:
    """One row of the verification table; `detail` holds what only its method has (see checks/README.md)."""

    id: str
    method: Method
    statement: str
    expected: str  # proved | refuted | none found | caught
    result: str
    ok: bool
    seconds: float
    detail: dict[str, Any] = attrs.field(factory=dict)
    tally: str | None = None  # the report total its detail["scenarios"] adds to (EXHAUSTIVE_INPUTS, LINK_INPUTS)

    def to_json(self) -> dict[str, Any]:
        """Return the row as the JSON object `kvspec verify --json` prints (detail keys flattened in)."""
        base = {"id": self.id, "method": str(self.method), "statement": self.statement, "expected": self.expected,
                "result": self.result, "ok": self.ok, "seconds": round(self.seconds, 3)}
        return {**base, **self.detail}


@attrs.define(kw_only=True)
class Count:
    """What one part found for one row of a pass: inputs checked, counterexamples kept, seconds; an exhaustive row's
    inputs evaluated afresh (the rest took an equal verdict key's verdict), a property row's refutations and hits
    above the physical best."""

    n: int = 0
    bad: list[Any] = attrs.field(factory=list)
    seconds: float = 0.0
    judged: int = 0
    fails: int = 0
    above: int = 0


@attrs.frozen(kw_only=True)
class PassPart:
    """A pass's part (exhaustive, link, property, Hypothesis): its rows' counts — in row order, or by rule set for a
    property pass, which `verify --fast` runs for some of its rule sets only."""

    rows: tuple[Count, ...] | dict[str, Count]

    def counts(self) -> list[Count]:
        """Return the rows' counts."""
        return list(self.rows.values()) if isinstance(self.rows, dict) else list(self.rows)

    def summary(self) -> str:
        """Return the progress line's result: inputs checked, counterexamples."""
        return (f"{sum(c.n for c in self.counts())} checked, "
                f"{sum(len(c.bad) for c in self.counts())} counterexamples")

    @property
    def seconds(self) -> float:
        """Return the seconds of every row of the part."""
        return sum(c.seconds for c in self.counts())


@attrs.frozen(kw_only=True)
class TheoremPart:
    """A theorem's verdict: Z3's answer, whether it is the expected one, seconds, queries, the resource used, why an
    unknown is unknown, a model (counterexample) and its `kvspec explain` command."""

    answer: str
    ok: bool
    seconds: float
    queries: int
    rlimit_used: int
    reason: str | None
    model: dict[str, int] | None
    command: str | None = None
    solver_seconds: float = 0.0  # of `seconds`, inside Z3's check
    rlimit_total: int = 0  # the resource units of all its queries (Z3's work: machine-independent)

    def summary(self) -> str:
        """Return the progress line's result: Z3's answer."""
        return self.answer


@attrs.frozen(kw_only=True)
class MutantPart:
    """A mutant's hunt: the checks that caught it (none: not caught), inputs tried, seconds, the first catching
    input."""

    caught_by: tuple[str, ...]
    tried: int
    seconds: float
    counterexample: str | None

    def summary(self) -> str:
        """Return the progress line's result: caught or not."""
        return "caught" if self.caught_by else "not caught"


Part = TheoremPart | PassPart | MutantPart  # what one part of a check returns (it crosses a process boundary)


class Check(Protocol):
    """A check of `make verify`: split into parts, each run anywhere, rendered into its rows — one for most checks,
    one per rule set or link of a shared pass (a row that checked nothing fails: an empty run shows nothing)."""

    @property
    def id(self) -> str: ...

    @property
    def budget_s(self) -> float: ...  # expected seconds of one part (orders the work, longest first)

    @property
    def fast(self) -> bool: ...  # part of `verify --fast`

    def parts(self, fast: bool) -> tuple[Any, ...]: ...

    def run(self, part: Any, fast: bool) -> Part: ...

    @property
    def row_ids(self) -> tuple[str, ...]: ...  # the rows it renders (most checks: its own id alone)

    def render(self, results: list[Part]) -> tuple[Row, ...]: ...


class OneRow:
    """A check that renders one row, under its own id."""

    @property
    def row_ids(self) -> tuple[str, ...]:
        return (cast(Check, self).id,)


class SharedPass:
    """A check whose `rows` field lists (row id, what the row covers): one pass, one row each; its id is the first's."""

    rows: tuple[tuple[str, Any], ...]

    @property
    def id(self) -> str:
        return self.rows[0][0]

    @property
    def row_ids(self) -> tuple[str, ...]:
        return tuple(rid for rid, _ in self.rows)


@functools.lru_cache(maxsize=1)
def _theorems() -> dict[str, Any]:
    return {t.name: t for t in compute_theorems()}


@attrs.frozen(kw_only=True)
class TheoremCheck(OneRow):
    """A Z3 theorem of checks/verify/prove.py, proved or refuted as expected; unknown is a failure."""

    id: str

    @property
    def budget_s(self) -> float:
        return float(_theorems()[self.id].budget_s)

    @property
    def fast(self) -> bool:
        return self.id in FAST_THEOREMS

    def parts(self, fast: bool) -> tuple[Any, ...]:
        return (None,)

    def run(self, part: Any, fast: bool) -> TheoremPart:
        th = _theorems()[self.id]
        v = prove(th)
        return TheoremPart(answer=v.answer, ok=v.ok, seconds=v.seconds, queries=v.queries, rlimit_used=v.rlimit_used,
                           reason=v.reason, model=v.model, solver_seconds=v.solver_seconds, rlimit_total=v.rlimit_total,
                           command=th.explain(v.model) if v.model is not None and th.explain is not None else None)

    def render(self, results: list[Part]) -> tuple[Row, ...]:
        th, r = _theorems()[self.id], cast(TheoremPart, results[0])
        detail: dict[str, Any] = {"rests_on": th.rests_on, "budget_s": th.budget_s, "precondition": th.precondition,
                                  "queries": r.queries, "rlimit": th.rlimit, "rlimit_used": r.rlimit_used,
                                  "solver_seconds": round(r.solver_seconds, 3), "rlimit_total": r.rlimit_total}
        if r.model is not None:
            detail["counterexample"] = r.model
        if r.command is not None:
            detail["command"] = r.command
        if r.reason:
            detail["reason"] = r.reason
        if not r.ok:
            detail["failures"] = [{"id": self.id, "result": r.answer, "reason": r.reason, "counterexample": r.model}]
        return (Row(id=self.id, method=Method.Z3, statement=th.statement, expected=th.expected,
                   result=r.answer + ("" if r.ok else " FAIL"), ok=r.ok, seconds=r.seconds, detail=detail),)


def _registry_ids() -> str:
    return ", ".join([inv.id for inv in REGISTRY if inv.kind in ("scenario", "maximal")] + ["I-21"])


Found = tuple[int, list[tuple[list[str], list[bool] | None]]]  # (inputs judged, violations: (ids, load results))


def _judge_registry(sc: Any) -> Any:
    """Return (witness, violated ids, {shared prefix: violated ids}) of one scenario judged by the registry (but the
    invariants reading the shared prefix, filled in per prefix by _finish_registry) and I-21; an evaluation error is a
    violation."""
    out = evaluate_scenario(sc)
    w, v = compute_keyed_violations(sc, out)
    return w, v + (("error",) if out.error is not None else ()), {}


def _finish_registry(sc: Any, verdict: Any) -> Found:
    """Return what the registry found in one scenario: its verdict and the invariants reading its shared prefix (judged
    once per prefix of a verdict)."""
    w, v, by_shared = verdict
    shared = compute_shared(sc)
    if shared not in by_shared:
        by_shared[shared] = v + compute_shared_violations(w, shared)
    v = by_shared[shared]
    return 1, ([(list(v), None)] if v else [])


def _failure_patterns(n: int) -> list[tuple[bool, ...]]:
    """Return the load results tried: all succeed, each single block fails, all fail."""
    out = [tuple([True] * n)] + [tuple(j != k for j in range(n)) for k in range(n)]
    return out + ([tuple([False] * n)] if n > 1 else [])


def _judge_failures(sc: Any) -> Found:
    """Return a scenario's load results judged by the failure closure (its rule set's closure steps), up to the first
    that violates it (a scenario without a hit has none)."""
    out, n = evaluate_scenario(sc), 0
    if out.hit_length <= 0:
        return 0, []
    for ok in _failure_patterns(len(out.load)):
        n += 1
        v = compute_failure_violations(sc, out, ok)
        if v:
            return n, [(list(v), list(ok))]
    return n, []


@attrs.frozen
class Judge:
    """What an exhaustive pass asks of each scenario, and how its rows say it."""

    judge: Callable[[Any], Any]  # scenario -> its verdict, shared by scenarios of equal verdict keys
    finish: Callable[[Any, Any], Found]  # (scenario, verdict) -> what it found in that scenario
    statement: Callable[[Scope], str]  # the row's statement
    inputs: str  # what the row counts
    tally: str | None  # the report total the row's inputs add to


JUDGES: dict[str, Judge] = {
    "registry": Judge(_judge_registry, _finish_registry,
                      lambda scope: f"registry ({_registry_ids()}) on every scenario of the scope "
                      f"'{scope.name}': {scope.describe()}", "scenarios", EXHAUSTIVE_INPUTS),
    "failure": Judge(_judge_failures, lambda sc, found: found,
                     lambda scope: "failure closure F-1, F-2, F-3, F-4, F-7, F-MAX for every "
                     f"single-block failure and total failure, every scenario with a hit of: {scope.describe()}",
                     "load results", None),
}


def _run_failures(scope: Scope, mutant: Mutant, fast: bool, stop_at_first: bool) -> Count:
    """Return the failure closure judged under a closure mutant on every scenario of a scope."""
    t0, n, bad = time.perf_counter(), 0, []
    for k, sc in enumerate(scope.iterate()):
        if fast and k % 20:
            continue
        m, found = _judge_failures(mutant.vary_scenario(sc))
        n += m
        bad += [{"violated": v, "scenario": repr(sc), "ok": ok} for v, ok in found]
        if bad and (stop_at_first or len(bad) >= MAX_FAILURES):
            break
    return Count(n=n, bad=bad, seconds=time.perf_counter() - t0)


@attrs.frozen(kw_only=True)
class ExhaustiveCheck(SharedPass):
    """A judge (the registry, or the failure closure) on every scenario of each scope, none may violate it: one row per
    scope. The scopes differ only in their rule set and are walked in one pass, geometry by geometry; a scenario whose
    verdict key (spec/invariants.py: compute_verdict_key) equals one already judged in the pass, under its own rule set
    or another, takes that verdict instead of a second evaluation; what the key leaves out (the shared prefix) the
    judge's `finish` reads per scenario. A rule set's row still counts every scenario."""

    rows: tuple[tuple[str, Scope], ...]  # (row id, scope); the first row's id is the check's
    judge: str = "registry"  # a key of JUDGES
    chunks: int = CHUNKS  # parts (geometries k, k + chunks, ...)
    budget_s: float = 8.0  # per part
    fast: bool = True  # --fast samples one geometry in Scope.fast_every

    def __attrs_post_init__(self) -> None:
        first = self.rows[0][1]
        if not all(first.same_but_rules(sc) for _, sc in self.rows):
            raise ValueError(f"{self.id}: one pass walks scopes that differ only in their rule set")

    def parts(self, fast: bool) -> tuple[Any, ...]:
        return tuple(range(self.chunks))

    def run(self, part: Any, fast: bool) -> PassPart:
        j, k = JUDGES[self.judge], len(self.rows)
        counts = tuple(Count() for _ in range(k))
        scope = self.rows[0][1]
        for g in scope.sample(part, self.chunks, scope.fast_every if fast else 1):
            verdicts: dict[tuple[Any, ...], Any] = {}  # this geometry's, under every rule set of the pass
            for (_, scope), c in zip(self.rows, counts):
                t0 = time.perf_counter()
                for sc in scope.scenarios(g):
                    if len(c.bad) >= MAX_FAILURES:
                        break
                    key = compute_verdict_key(sc)
                    fresh = key not in verdicts
                    if fresh:
                        verdicts[key] = j.judge(sc)
                    found = j.finish(sc, verdicts[key])
                    c.n += found[0]
                    c.judged += found[0] if fresh else 0
                    if found[1]:
                        c.bad += [{"violated": v, "scenario": repr(sc), **({"ok": ok} if ok is not None else {})}
                                  for v, ok in found[1]]
                c.seconds += time.perf_counter() - t0
        return PassPart(rows=counts)

    def render(self, results: list[Part]) -> tuple[Row, ...]:
        rows, j = [], JUDGES[self.judge]
        for i, (rid, scope) in enumerate(self.rows):
            mine = [cast(PassPart, r).counts()[i] for r in results]
            n, judged, bad = sum(c.n for c in mine), sum(c.judged for c in mine), [b for c in mine for b in c.bad]
            rows.append(Row(id=rid, method=Method.EXHAUSTIVE, statement=j.statement(scope), expected="none found",
                            result=f"{n} {j.inputs}, {len(bad)} violations", ok=n > 0 and not bad,
                            seconds=sum(c.seconds for c in mine), tally=j.tally,
                            detail={"scenarios": n, "evaluated": judged, "scope": scope.name, "rules": scope.rules,
                                    "failures": bad[:MAX_FAILURES]}))
        return tuple(rows)


LINK_WHAT = {"lookup": "closed form == executable fixed point (h, tail boundaries)",
             "failure": "closed-form safe boundary == spec/failure.py for every first failed attention block, Mamba "
                        "block loaded or not, and the capped retry's hit",
             "best": "the closed form's best (closed_form.is_closed_servable: the efficiency theorems' statement) == "
                     "spec/lookup.py's: compute_best_hit of E and of E minus each one stored object, "
                     "compute_physical_best of E",
             "schedules": "closed form over the Mamba states a chunk schedule left (the any-schedule theorems' "
                          "predicate) == the spec under that schedule (h, tail boundaries); the states lie on Mamba "
                          "block ends with a hash or C, and C is among them"}


@attrs.frozen(kw_only=True)
class LinkCheck(SharedPass):
    """The closed form the theorems are proved on equals the executable spec on every input of a scope: its lookup,
    and (a second row) its failure closure; one pass, each input's closed form and evaluation shared by both rows."""

    rows: tuple[tuple[str, str], ...]  # (row id, what: a key of LINK_WHAT); the first row's id is the check's
    scope: LinkScope
    rule: str = PR53324  # the store rule of the closed form and of the scenarios
    budget_s: float = 8.0
    fast: bool = True  # --fast takes every 7th input

    def parts(self, fast: bool) -> tuple[Any, ...]:
        return (None,)

    def run(self, part: Any, fast: bool) -> PassPart:
        counts = tuple(Count() for _ in self.rows)
        for j, x in enumerate(self.scope.iterate()):
            if fast and j % 7:
                continue
            for (_, what), c in zip(self.rows, counts):
                if c.bad:  # a row stops at its first difference
                    continue
                t0 = time.perf_counter()
                if what == "schedules":  # one input per (closed-form input, schedule)
                    c.n += len(self.scope.schedules)
                    r = next((d for sch in self.scope.schedules
                              if (d := compare_schedule(x, sch, self.scope.draft, self.rule))), None)
                else:
                    c.n += 1
                    r = (compare_failure(x, self.rule) if what == "failure" else compare_best(x, self.rule)
                         if what == "best" else compare(x, self.scope.draft, self.rule))
                if r:
                    c.bad.append(r)
                c.seconds += time.perf_counter() - t0
        return PassPart(rows=counts)

    def render(self, results: list[Part]) -> tuple[Row, ...]:
        rows = []
        for i, (rid, what) in enumerate(self.rows):
            r = cast(PassPart, results[0]).counts()[i]
            text = LINK_WHAT[what] + (f" under {self.rule}'s store rule"
                                      if get_rules(self.rule).store != STORE_PR53324 else "")
            rows.append(Row(id=rid, method=Method.EXHAUSTIVE, statement=f"{text} on every input of: {self.scope.describe()}",
                            expected="none found", result=f"{r.n} inputs, {len(r.bad)} differences",
                            ok=r.n > 0 and not r.bad, seconds=r.seconds, detail={"scenarios": r.n, "failures": r.bad},
                            tally=LINK_INPUTS))
        return tuple(rows)


@attrs.frozen(kw_only=True)
class LinkHypothesisCheck(OneRow):
    """The link at large scale: u ≤ 256, b ≤ 16u, D ≤ 16, prompts up to 10^6 (within spec/limits.py)."""

    id: str = "LINK-hypothesis"
    rule: str = PR53324
    examples: int = 400
    budget_s: float = 2.0
    fast: bool = True

    def parts(self, fast: bool) -> tuple[Any, ...]:
        return (None,)

    def run(self, part: Any, fast: bool) -> PassPart:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        t0, seen = time.perf_counter(), {"n": 0}

        @st.composite
        def params(draw: Any) -> Params:
            u, q, d = draw(st.integers(1, 256)), draw(st.integers(1, 16)), draw(st.sampled_from([1, 2, 4, 8, 16]))
            # prompts within spec/limits.py for this geometry (attention, draft, Mamba groups; one stored request)
            top = max(1, min(10**6, compute_longest_prompt(d, (q * u * d, q * u * d, q * u), 1, 0)))
            p = draw(st.integers(0, top))
            n = draw(st.one_of(st.just(max(p, 1)), st.integers(1, top)))
            s = draw(st.one_of(st.just(min(p, n)), st.integers(0, min(p, n))))
            return Params(u=u, q=q, d=d, e=draw(st.integers(0, 1)), dense=draw(st.integers(0, 1)), p=p, n=n,
                          s_shared=s)

        @settings(max_examples=self.examples // (7 if fast else 1), deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(params(), st.booleans())
        def agree(x: Params, draft: bool) -> None:
            seen["n"] += 1
            r = compare(x, draft=draft, rule=self.rule)
            assert r is None, r

        bad = []
        try:
            agree()
        except AssertionError as exc:
            bad.append(str(exc).splitlines()[0])
        return PassPart(rows=(Count(n=seen["n"], bad=bad, seconds=time.perf_counter() - t0),))

    def render(self, results: list[Part]) -> tuple[Row, ...]:
        r = cast(PassPart, results[0]).counts()[0]
        return (Row(id=self.id, method=Method.HYPOTHESIS, statement="closed form == executable fixed point (h, tail "
                   f"boundaries) under {self.rule}'s store rule, u ≤ 256, b ≤ 16u, D ≤ 16, P and N ≤ 10^6, with and "
                   "without a draft group",
                   expected="none found", result=f"{r.n} inputs, {len(r.bad)} differences", ok=r.n > 0 and not r.bad,
                   seconds=r.seconds, detail={"scenarios": r.n, "failures": r.bad}, tally=LINK_INPUTS),)


@attrs.frozen(kw_only=True)
class MutantCheck(OneRow):
    """A known bug (checks/verify/mutants.py) must be caught: by the registry on a scope, or (closure) on failed loads."""

    id: str
    mutant: str
    budget_s: float = 0.5
    fast: bool = True

    def _mutant(self) -> Any:
        return next(m for m in MUTANTS if m.name == self.mutant)

    def parts(self, fast: bool) -> tuple[Any, ...]:
        return (None,)

    def run(self, part: Any, fast: bool) -> MutantPart:
        m, t0 = self._mutant(), time.perf_counter()
        if m.efficiency:  # a safe store rule that stores less: the efficiency rows under its rule sets must move
            rows = [row for check in compute_property_checks(mutant=m.name, props=m.efficiency)
                    for row in check.render([check.run(p, False) for p in check.parts(False)])]
            bad = [row for row in rows if not row.ok]
            return MutantPart(caught_by=tuple(row.id for row in bad), tried=sum(row.detail["scenarios"] for row in rows),
                              seconds=time.perf_counter() - t0,
                              counterexample=_find_efficiency_loss(m.name, bad[0].id) if bad else None)
        if m.closure:
            r = _run_failures(SCOPE_FAILURE, m, fast=False, stop_at_first=True)
            return MutantPart(caught_by=tuple(sorted({v for b in r.bad for v in b["violated"]})), tried=r.n,
                              seconds=r.seconds, counterexample=r.bad[0]["scenario"] if r.bad else None)
        caught_by, sc, n = hunt(m, SCOPE_MUTANTS.iterate())
        return MutantPart(caught_by=tuple(caught_by), tried=n, seconds=time.perf_counter() - t0,
                          counterexample=format_explain_command(sc) if sc is not None else None)

    def render(self, results: list[Part]) -> tuple[Row, ...]:
        r, m = cast(MutantPart, results[0]), self._mutant()
        ok = bool(r.caught_by)
        return (Row(id=self.id, method=Method.MUTANT, statement=m.bug, expected="caught",
                   result=f"caught by {', '.join(r.caught_by)}" if ok else "NOT CAUGHT", ok=ok,
                   seconds=r.seconds, detail={"tried": r.tried, "counterexample": r.counterexample}),)


def _find_efficiency_loss(mutant: str, row_id: str) -> str | None:
    """Return the explain command of the first instance of a property row that holds under the spec and not under the
    mutant's rule set (what the mutant loses), over the small scope."""
    prop, rules = row_id.split("/", 1)
    varied = next(m for m in MUTANTS if m.name == mutant).vary(get_rules(rules))
    for g in iterate_geometries(SCOPE_SMALL.dcps, SCOPE_SMALL.units, SCOPE_SMALL.max_q):
        for spec, mine in zip(PROPERTIES[prop][1](g, rules, Memo()), PROPERTIES[prop][1](g, varied, Memo())):
            if spec.holds and not mine.holds:
                return f"{format_explain_command(mine.scenario)}  # {mine.what} (the spec's rule: {spec.what})"
    return None


@attrs.frozen(kw_only=True)
class PropertyCheck:
    """A cache-efficiency property (checks/verify/efficiency.py) over every `sample`-th geometry of a scope, one row per rule
    set: expected to hold, or to be refuted (a finding, printed as a runnable counterexample). A hit above the physical
    best fails the row whatever is expected. The rule sets run in one pass, geometry by geometry, and a scenario whose
    verdict key (spec/invariants.py) equals one already read under another rule set takes its hit."""

    prop: str
    rows: tuple[tuple[str, str, int | None], ...]  # (rule set, holds | refuted, refutations measured at `sample`)
    sample: int = 1
    scope: Scope = SCOPE_SMALL
    budget_s: float = 5.0
    mutant: str | None = None  # run under a mutant's rule sets (checks/verify/mutants.py) instead of the spec's

    @property
    def id(self) -> str:
        return self.row_ids[0]

    @property
    def row_ids(self) -> tuple[str, ...]:
        return tuple(f"{self.prop}/{rules}" for rules, _, _ in self.rows)

    @property
    def fast(self) -> bool:
        """Return whether `verify --fast` runs it: its rows expected to hold, on their sample; a refutation is not sure
        to show in a sample, so a row expected refuted runs only in full verify."""
        return any(e == PROPERTY_HOLDS for _, e, _ in self.rows)

    def parts(self, fast: bool) -> tuple[Any, ...]:
        return tuple(range(CHUNKS))

    def run(self, part: Any, fast: bool) -> PassPart:
        rows = {rules: Count() for rules, e, _ in self.rows if e == PROPERTY_HOLDS or not fast}
        mutant = next((m for m in MUTANTS if m.name == self.mutant), None) if self.mutant is not None else None
        for g in self.scope.sample(part, CHUNKS, self.sample * (self.scope.fast_every if fast else 1)):
            memo = Memo()  # this geometry's, under every rule set of the pass
            for rules, r in rows.items():
                t0 = time.perf_counter()
                rs = get_rules(rules) if mutant is None else mutant.vary(get_rules(rules))
                for inst in PROPERTIES[self.prop][1](g, rs, memo):
                    r.n += 1
                    r.above += inst.above_best
                    if not inst.holds:
                        r.fails += 1
                        if not r.bad:
                            r.bad.append({"command": format_explain_command(inst.scenario), "what": inst.what})
                r.seconds += time.perf_counter() - t0
        return PassPart(rows=rows)  # keyed by rule set: --fast leaves some out

    def render(self, results: list[Part]) -> tuple[Row, ...]:
        out = []
        for rules, expected, count in self.rows:
            mine = [c for r in results if (c := cast(dict[str, Count], cast(PassPart, r).rows).get(rules))]
            if not mine:  # not run (verify --fast leaves out the rows expected refuted)
                continue
            n, fails, above = sum(c.n for c in mine), sum(c.fails for c in mine), sum(c.above for c in mine)
            first = next((c.bad[0] for c in mine if c.bad), None)
            holds = fails == 0
            # no instance: nothing shown, a failure; a refuted row keeps its measured count (a store or lookup rule
            # that loses more, or less, cache than it did is a change worth a look, even when it stays safe)
            ok = (n > 0 and holds == (expected == PROPERTY_HOLDS) and above == 0
                  and (count is None or holds or fails == count))
            result = (f"holds on {n}" if holds else f"refuted: {fails} of {n}") + (f", {above} ABOVE the best"
                                                                                  if above else "")
            if count is not None and not holds and fails != count:
                result += f" (measured: {count})"
            detail: dict[str, Any] = {"scenarios": n, "refutations": fails, "rules": rules, "above_best": above}
            if first is not None:
                detail["counterexample"] = first["what"]
                detail["command"] = first["command"]
            if not ok:
                detail["failures"] = [first or {"what": f"expected {expected}, found it holds on {n} instances"}]
                if count is not None and not holds and fails != count:
                    detail["failures"] = [{**(first or {}), "example": (first or {}).get("what"),
                                           "what": f"{fails} refutations where {count} were measured: the rule set "
                                                   f"uses the cache differently"}]
            every = f"one geometry in {self.sample} of " if self.sample > 1 else ""
            out.append(Row(id=f"{self.prop}/{rules}", method=Method.EXHAUSTIVE, statement=f"{PROPERTIES[self.prop][0]} "
                           f"[rules {rules}; {every}the scope '{self.scope.name}']", expected=expected, result=result,
                           ok=ok, seconds=sum(c.seconds for c in mine), detail=detail))
        return tuple(out)


assert {e.prop for r in RULE_CHECKS for e in r.properties} <= set(PROPERTIES), "a property row names a property"


def compute_property_checks(full: bool = False, mutant: str | None = None,
                            props: tuple[str, ...] | None = None) -> list[PropertyCheck]:
    """Return the rule-set table's property rows (checks/rulesets.py `properties`) as property checks: a property's rule
    sets of one sample in one pass, properties in PROPERTIES' order, rule sets in table order (every geometry and no
    pinned count when `full`; only `props`, under a mutant's rule sets, when given)."""
    passes: dict[tuple[str, int], list[tuple[str, str, int | None]]] = {}
    for p in PROPERTIES if props is None else [q for q in PROPERTIES if q in props]:
        for r in RULE_CHECKS:
            for e in r.properties:
                if e.prop == p:
                    passes.setdefault((p, 1 if full else e.sample), []).append(
                        (r.rules, e.expected, None if full else e.count))
    return [PropertyCheck(prop=p, rows=tuple(rows), sample=k, mutant=mutant) for (p, k), rows in passes.items()]


@functools.lru_cache(maxsize=2)
def compute_manifest(full: bool = False) -> tuple[Check, ...]:
    """Return every check of `make verify`, in table order; `full` (make verify-full): no property row samples its
    scope."""
    out: list[Check] = [TheoremCheck(id=t.name) for t in compute_theorems()]
    # a row per rule set whose table row asks for one (checks/rulesets.py: in make verify, or in verify-full only)
    runs = (EXHAUSTIVE_VERIFY, EXHAUSTIVE_FULL) if full else (EXHAUSTIVE_VERIFY,)
    exhaustive = tuple(("EXHAUSTIVE" + (f"/{r.rules}" if r.at else ""), compute_registry_scope(r.rules))
                       for r in RULE_CHECKS if r.exhaustive in runs)
    out += [ExhaustiveCheck(rows=exhaustive),
            ExhaustiveCheck(rows=(("EXHAUSTIVE/vllm-0.33.0/schedules", SCOPE_SCHEDULES_VLLM),
                                  ("EXHAUSTIVE/vllm-0.34.0/schedules", SCOPE_SCHEDULES_0_34))),
            LinkCheck(rows=(("LINK-exhaustive", "lookup"), ("LINK-failure", "failure")), scope=LINK_SCOPE),
            LinkCheck(rows=(("LINK-best", "best"),), scope=LINK_SCOPE_BEST),
            LinkHypothesisCheck(), LinkCheck(rows=(("LINK-exhaustive-draft", "lookup"),), scope=LINK_SCOPE_DRAFT)]
    for r in VLLM_RULES:  # each closed form of vLLM 0.33.0's store rule, linked as the PR's is
        out += [LinkCheck(rows=((f"LINK-{r}", "lookup"), (f"LINK-failure-{r}", "failure")), scope=LINK_SCOPE, rule=r),
                LinkCheck(rows=((f"LINK-best-{r}", "best"),), scope=LINK_SCOPE_BEST, rule=r),
                LinkCheck(rows=((f"LINK-{r}-draft", "lookup"),), scope=LINK_SCOPE_DRAFT, rule=r),
                LinkHypothesisCheck(id=f"LINK-hypothesis-{r}", rule=r),
                LinkCheck(rows=((f"LINK-{r}/schedules", "schedules"),), scope=LINK_SCOPE_SCHEDULES, rule=r)]
    out.append(ExhaustiveCheck(rows=(("FAIL-exhaustive", SCOPE_FAILURE),) + tuple(  # F-7's capped re-lookup included
        (f"FAIL-exhaustive/{r}", attrs.evolve(SCOPE_FAILURE, name=f"failure-{r}", rules=r)) for r in VLLM_RULES),
        judge="failure", chunks=4))
    out += compute_property_checks(full)
    out += [MutantCheck(id=f"MUT-{m.name}", mutant=m.name) for m in MUTANTS]
    return tuple(out)


