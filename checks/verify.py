"""`make verify`: Z3 theorems, the closed-form link, bounded exhaustive runs and mutants, as one table.

Every row: check id, statement, method (z3 / exhaustive / hypothesis / mutant), result, seconds.
Exit status 0 only when every theorem has its expected answer (unknown = failure), every
exhaustive and link run found nothing, and every mutant was caught.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvspec.spec.scenario import Scenario

ROW = dict[str, Any]
STRIDE = 12  # exhaustive work split into this many chunks


def _z3_task(idx: int, fast: bool) -> ROW:
    from .prove import format_explain_command, prove
    th = _theorems(fast)[idx]
    v = prove(th)
    row: ROW = {"id": th.name, "statement": th.statement, "method": "z3", "expected": th.expected,
                "result": v.answer, "ok": v.ok, "seconds": round(v.seconds, 3), "rests_on": th.rests_on,
                "budget_s": th.budget_s, "precondition": th.precondition, "queries": v.queries,
                "rlimit": th.rlimit, "rlimit_used": v.rlimit_used}
    if v.model is not None:
        row["counterexample"] = v.model
        if th.name.startswith("LEGACY"):
            row["command"] = format_explain_command(v.model)
    if v.reason:
        row["reason"] = v.reason
    return row


FAST_THEOREMS = ("I-1/2", "I-6", "LEMMA-MAMBA", "I-14", "I-18", "I-20", "LEGACY-D1-SAFE", "LEGACY-I-20")


def _theorems(fast: bool) -> tuple[Any, ...]:
    from .prove import compute_theorems
    ths = compute_theorems()
    if fast:  # the quick theorems: a lemma, two invariants on the chain, both legacy results
        ths = tuple(t for t in ths if t.name in FAST_THEOREMS)
    return ths


def _exhaustive_task(offset: int, fast: bool) -> ROW:
    from kvspec.spec.invariants import compute_violations
    from kvspec.spec.scenario import evaluate_scenario

    from .exhaustive import iterate_all
    t0 = time.perf_counter()
    n, bad = 0, []
    stride = STRIDE * (40 if fast else 1)
    for sc in iterate_all(stride=stride, offset=offset):
        out = evaluate_scenario(sc)
        v = compute_violations(sc, out, out.present)
        n += 1
        if v or out.error is not None:
            bad.append({"violated": list(v), "scenario": repr(sc)})
            if len(bad) >= 3:
                break
    return {"id": f"EXH-{offset}", "n": n, "bad": bad, "seconds": time.perf_counter() - t0}


FAILURE_SCOPE: dict[str, Any] = dict(dcps=(1, 2, 4), units=(1, 2), max_q=3)


def _failure_scenarios(fast: bool) -> Iterator[Scenario]:
    from .exhaustive import iterate_all
    for k, sc in enumerate(iterate_all(dcps=FAILURE_SCOPE["dcps"], evict=False)):
        if sc.geometry.unit in FAILURE_SCOPE["units"] and all(
                gr.block_size <= FAILURE_SCOPE["max_q"] * sc.geometry.unit for gr in sc.geometry.groups) and (
                not fast or k % 20 == 0):
            yield sc


def _failure_patterns(n: int) -> Iterator[tuple[bool, ...]]:
    yield tuple([True] * n)
    for k in range(n):
        yield tuple(j != k for j in range(n))
    if n > 1:
        yield tuple([False] * n)


def _failure_task(part: str, fast: bool) -> ROW:
    from kvspec.spec.invariants import compute_failure_violations
    from kvspec.spec.scenario import evaluate_scenario
    t0 = time.perf_counter()
    n, bad = 0, []
    from kvspec.spec.scenario import SPEC_STAGES

    from .mutants import MUTANTS
    stages = SPEC_STAGES if part == "exhaustive" else next(m.stages for m in MUTANTS if m.name == part)
    for sc in _failure_scenarios(fast):
        out = evaluate_scenario(sc)
        if out.hit_length <= 0:
            continue
        for ok in _failure_patterns(len(out.load)):
            n += 1
            v = compute_failure_violations(sc, out, ok, stages)
            if v:
                bad.append({"violated": list(v), "scenario": repr(sc), "ok": list(ok)})
                break
        if bad:
            break
    return {"id": f"FAIL-{part}", "n": n, "bad": bad, "seconds": time.perf_counter() - t0}


def _link_task(part: str, fast: bool) -> ROW:
    from .link import compare, iterate_small_scope
    t0 = time.perf_counter()
    n, bad = 0, []
    if part == "exhaustive":
        scope = iterate_small_scope(dcps=(1, 2, 8) if fast else (1, 2, 4, 8), units=(1, 2), max_q=2, blocks=1)
        draft = False
    elif part == "exhaustive-draft":
        scope = iterate_small_scope(dcps=(1, 4), units=(1, 2), max_q=2, blocks=1)
        draft = True
    else:
        return _link_hypothesis(fast)
    for k, x in enumerate(scope):
        if fast and k % 7:
            continue
        n += 1
        r = compare(x, draft=draft)
        if r:
            bad.append(r)
            break
    return {"id": f"LINK-{part}", "n": n, "bad": bad, "seconds": time.perf_counter() - t0}


def _link_hypothesis(fast: bool) -> ROW:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kvspec.spec.limits import compute_longest_prompt

    from .closed_form import Params
    from .link import compare
    t0 = time.perf_counter()
    seen = {"n": 0}

    @st.composite
    def params(draw: Any) -> Params:
        u = draw(st.integers(1, 256))
        q = draw(st.integers(1, 16))
        d = draw(st.sampled_from([1, 2, 4, 8, 16]))
        # prompts within spec/limits.py for this geometry (attention, draft, Mamba groups; one stored request)
        top = max(1, min(10**6, compute_longest_prompt(d, (q * u * d, q * u * d, q * u), 1, 0)))
        p = draw(st.integers(0, top))
        n = draw(st.one_of(st.just(max(p, 1)), st.integers(1, top)))
        s = draw(st.one_of(st.just(min(p, n)), st.integers(0, min(p, n))))
        return Params(u=u, q=q, d=d, e=draw(st.integers(0, 1)), dense=draw(st.integers(0, 1)), p=p, n=n, s_shared=s)

    @settings(max_examples=60 if fast else 400, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(params(), st.booleans())
    def agree(x: Params, draft: bool) -> None:
        seen["n"] += 1
        r = compare(x, draft=draft)
        assert r is None, r

    bad = []
    try:
        agree()
    except AssertionError as exc:
        bad.append(str(exc).splitlines()[0])
    return {"id": "LINK-hypothesis", "n": seen["n"], "bad": bad, "seconds": time.perf_counter() - t0}


def _mutant_task(name: str, fast: bool) -> ROW:
    from .exhaustive import iterate_all
    from .mutants import MUTANTS, hunt
    m = next(m for m in MUTANTS if m.name == name)
    t0 = time.perf_counter()
    caught, sc, n = hunt(m, iterate_all(dcps=(2, 8, 4, 1)))
    return {"id": f"MUT-{name}", "statement": m.bug, "method": "mutant", "result": "caught" if caught else "MISSED",
            "ok": bool(caught), "caught_by": list(caught), "tried": n, "seconds": round(time.perf_counter() - t0, 3),
            "counterexample": repr(sc) if sc is not None else None}


def _run(task: tuple[str, Any, bool]) -> ROW:
    kind, arg, fast = task
    tasks: dict[str, Callable[[Any, bool], ROW]] = {"z3": _z3_task, "exh": _exhaustive_task, "link": _link_task,
                                                    "mut": _mutant_task, "fail": _failure_task}
    fn = tasks[kind]
    row = fn(arg, fast)
    row["kind"] = kind
    return row


def _progress(row: ROW, done: int, total: int, t0: float) -> None:
    """Print one line on stderr as a task ends: its id, result, elapsed time, tasks left."""
    what = row.get("result") or (f"{row['n']} checked, {len(row['bad'])} bad" if "n" in row else
                                 ("caught" if row.get("ok") else "not caught"))
    print(f"verify: [{done}/{total}] {row['id']}: {what} ({row.get('seconds', 0):.1f} s; "
          f"{time.perf_counter() - t0:.0f} s elapsed, {total - done} left)", file=sys.stderr, flush=True)


def _run_indexed(task: tuple[int, tuple[str, Any, bool]]) -> tuple[int, ROW]:
    return task[0], _run(task[1])


def compute_row_id(task: tuple[str, Any, bool]) -> str:
    """Return the id of the table row a task contributes to (what --list shows and --only selects)."""
    kind, arg, fast = task
    if kind == "z3":
        return str(_theorems(fast)[arg].name)
    if kind == "exh":
        return "EXHAUSTIVE"
    if kind == "fail":
        return "FAIL-exhaustive" if arg == "exhaustive" else f"MUT-{arg}"
    return f"{'LINK' if kind == 'link' else 'MUT'}-{arg}"


def compute_tasks(fast: bool = False, only: tuple[str, ...] = ()) -> list[tuple[str, Any, bool]]:
    """Return the tasks of the table, longest first; with `only`, those of the rows whose id matches a pattern."""
    import fnmatch

    from .mutants import MUTANTS
    # longest first, so the two cores finish together: the theorems by budget, then the big runs
    ths = _theorems(fast)
    tasks: list[tuple[str, Any, bool]] = [("z3", i, fast) for i in sorted(range(len(ths)), key=lambda i: -ths[i].budget_s)]
    tasks += [("fail", "exhaustive", fast)]
    tasks += [("exh", k, fast) for k in range(STRIDE)]
    tasks += [("link", p, fast) for p in ("exhaustive", "hypothesis", "exhaustive-draft")]
    tasks += [("mut", m.name, fast) for m in MUTANTS if not m.closure]
    tasks += [("fail", m.name, fast) for m in MUTANTS if m.closure]
    if only:
        tasks = [t for t in tasks if any(fnmatch.fnmatchcase(compute_row_id(t), pat) for pat in only)]
    return tasks


def collect(fast: bool = False, processes: int | None = None, progress: bool = False,
            only: tuple[str, ...] = ()) -> list[ROW]:
    """Return every row of the verification table (runs the work on all cores)."""
    tasks = compute_tasks(fast, only)
    procs = processes or min(len(tasks), os.cpu_count() or 1)
    t0, done = time.perf_counter(), []
    with mp.get_context("fork").Pool(procs) if procs > 1 else contextlib.nullcontext() as pool:
        for k, row in (pool.imap_unordered(_run_indexed, enumerate(tasks)) if pool is not None
                       else map(_run_indexed, enumerate(tasks))):
            done.append((k, row))
            if progress:
                _progress(row, len(done), len(tasks), t0)
    return [row for _, row in sorted(done, key=lambda x: x[0])]  # task order, whatever order they ended in


def summarize(rows: list[ROW], fast: bool) -> dict[str, Any]:
    """Return the table rows for display and the totals."""
    from kvspec.spec.invariants import REGISTRY

    from .mutants import MUTANTS
    from .prove import SCOPE, compute_theorems
    table: list[ROW] = []
    order = {t.name: k for k, t in enumerate(compute_theorems())}  # the table keeps the theorems' order
    z3rows = sorted((r for r in rows if r["kind"] == "z3"), key=lambda r: order.get(r["id"], len(order)))
    for r in z3rows:
        row = {k: v for k, v in r.items() if k != "kind"}
        if not r["ok"]:
            row["result"] += " FAIL"
            row["failures"] = [{k: r.get(k) for k in ("id", "result", "reason", "counterexample")}]
        table.append(row)
    exh = [r for r in rows if r["kind"] == "exh"]
    n_exh = sum(r["n"] for r in exh)
    bad_exh = [b for r in exh for b in r["bad"]]
    ids = [inv.id for inv in REGISTRY if inv.kind == "scenario"] + ["I-21"]
    if exh:  # absent when --only leaves no exhaustive chunk
        table.append({"id": "EXHAUSTIVE", "statement": f"registry ({', '.join(ids)}) on every scenario of the small "
                      "scope (D∈{1,2,4,8}, u∈{1,2,4}, b≤4u, ≤3 groups, EAGLE, retentions, shared prefixes, evictions)",
                      "method": "exhaustive", "result": f"{n_exh} scenarios, {len(bad_exh)} violations",
                      "ok": not bad_exh, "seconds": round(sum(r["seconds"] for r in exh), 2), "scenarios": n_exh,
                      "failures": bad_exh[:3]})
    for r in (r for r in rows if r["kind"] == "link"):
        method = "hypothesis" if r["id"].endswith("hypothesis") else "exhaustive"
        table.append({"id": r["id"], "statement": "closed form == executable fixed point (h, tail boundaries)"
                      + (" with a draft group" if "draft" in r["id"] else ""), "method": method,
                      "result": f"{r['n']} inputs, {len(r['bad'])} differences", "ok": not r["bad"],
                      "seconds": round(r["seconds"], 2), "scenarios": r["n"], "failures": r["bad"]})
    for r in (r for r in rows if r["kind"] == "mut"):
        table.append({"id": r["id"], "statement": r["statement"], "method": "mutant",
                      "result": f"caught by {', '.join(r['caught_by'])}" if r["ok"] else "NOT CAUGHT",
                      "ok": r["ok"], "seconds": r["seconds"], "tried": r["tried"],
                      "counterexample": r["counterexample"]})
    for r in (r for r in rows if r["kind"] == "fail"):
        if r["id"] == "FAIL-exhaustive":
            table.append({"id": r["id"], "statement": "failure closure F-1, F-2, F-3, F-4, F-7 for every single-block "
                          "failure and total failure, every scenario with a hit of D∈{1,2,4}, u∈{1,2}, b≤3u",
                          "method": "exhaustive", "result": f"{r['n']} load results, {len(r['bad'])} violations",
                          "ok": not r["bad"], "seconds": round(r["seconds"], 2), "scenarios": r["n"],
                          "failures": r["bad"][:3]})
        else:
            caught = [v for b in r["bad"] for v in b["violated"]]
            name = r["id"][len("FAIL-"):]
            table.append({"id": f"MUT-{name}", "method": "mutant",
                          "statement": next(m.bug for m in MUTANTS if m.name == name),
                          "result": f"caught by {', '.join(caught)}" if caught else "NOT CAUGHT",
                          "ok": bool(caught), "seconds": round(r["seconds"], 2), "tried": r["n"],
                          "counterexample": r["bad"][0]["scenario"] if r["bad"] else None})
    ok = all(r["ok"] for r in table)
    return {"ok": ok, "fast": fast, "z3_scope": SCOPE, "rows": table,
            "totals": {"checks": len(table), "failed": sum(not r["ok"] for r in table),
                       "z3_calls": len(z3rows), "z3_proved": sum(r["result"] == "proved" for r in z3rows),
                       "z3_refuted": sum(r["result"] == "refuted" for r in z3rows),
                       "z3_unknown": sum(r["result"] == "unknown" for r in z3rows),
                       "exhaustive_scenarios": n_exh,
                       "link_inputs": sum(r["n"] for r in rows if r["kind"] == "link"),
                       "mutants": sum(r["method"] == "mutant" for r in table),
                       "mutants_caught": sum(r["method"] == "mutant" and r["ok"] for r in table)}}


def format_table(report: dict[str, Any]) -> str:
    """Return the human-readable verification table."""
    lines = [f"{'check':<22} {'method':<10} {'result':<34} {'s':>7}  statement"]
    for r in report["rows"]:
        lines.append(f"{r['id']:<22} {r['method']:<10} {r['result'][:34]:<34} {r['seconds']:>7.2f}  {r['statement']}")
        if r["method"] == "z3":
            lines.append(f"{'':<22} {r['queries']} queries, at most {r['rlimit_used'] / 1e6:.1f}M of a "
                         f"{r['rlimit'] / 1e6:.0f}M resource budget per query ({r['seconds']:.2f} s); "
                         f"precondition: {r['precondition']}; rests on: {r['rests_on']}")
        if "command" in r:
            lines.append(f"{'':<22} counterexample (expected): {r['command']}")
        if r["method"] == "mutant" and r["ok"]:
            lines.append(f"{'':<22} first caught after {r['tried']} scenarios: {r['counterexample'][:160]}")
        for f in r.get("failures") or []:
            lines.append(f"{'':<22} FAILURE: {f}")
    t = report["totals"]
    lines.append("")
    lines.append(f"z3 scope of the scenario theorems: {report['z3_scope']}")
    lines.append(f"totals: {t['checks']} checks, {t['failed']} failed; z3 {t['z3_calls']} calls: {t['z3_proved']} proved,"
                 f" {t['z3_refuted']} refuted, {t['z3_unknown']} unknown; exhaustive {t['exhaustive_scenarios']} "
                 f"scenarios; link {t['link_inputs']} inputs; mutants {t['mutants_caught']}/{t['mutants']} caught")
    lines.append("VERIFY: OK" if report["ok"] else "VERIFY: FAILED")
    return "\n".join(lines)


def format_junit(report: dict[str, Any]) -> str:
    """Return the table as JUnit XML: one testcase per row (classname = method), a failure per failed row."""
    from xml.etree import ElementTree as ET
    rows = report["rows"]
    suite = ET.Element("testsuite", name="kvspec-verify", tests=str(len(rows)),
                       failures=str(sum(not r["ok"] for r in rows)), time=str(report.get("wall_seconds", 0)))
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=f"verify.{r['method']}", name=r["id"],
                             time=str(r["seconds"]))
        ET.SubElement(case, "system-out").text = f"{r['statement']}: {r['result']}"
        if not r["ok"]:
            ET.SubElement(case, "failure", message=str(r["result"])).text = json.dumps(r.get("failures"), default=str)
    return str(ET.tostring(suite, encoding="unicode"))


def run_verify(json_out: bool = False, fast: bool = False, junit: str | None = None, progress: bool = True,
               only: tuple[str, ...] = (), list_only: bool = False) -> int:
    """Run everything (or the rows `only` names), print the table (or JSON); return 0 when all checks pass."""
    if list_only:
        for t in compute_tasks(fast, only):
            rid = compute_row_id(t)
            if rid != "EXHAUSTIVE" or t[1] == 0:
                print(f"{rid:<24} {t[0]}")
        return 0
    tasks = compute_tasks(fast, only)
    if not tasks:
        from kvspec.spec.errors import SpecError
        raise SpecError("verify-only", f"no check matches {' '.join(only)} (kvspec verify --list shows the ids)")
    t0 = time.perf_counter()
    report = summarize(collect(fast, progress=progress, only=only), fast)
    report["wall_seconds"] = round(time.perf_counter() - t0, 2)
    if junit:
        os.makedirs(os.path.dirname(os.path.abspath(junit)), exist_ok=True)
        with open(junit, "w") as f:
            f.write(format_junit(report) + "\n")
    if json_out:
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
        print(f"wall time: {report['wall_seconds']} s")
    sys.stdout.flush()
    return 0 if report["ok"] else 1
