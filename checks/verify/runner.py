"""`make verify`: expand the manifest (checks/verify/manifest.py) into parts, run them on every core, render the rows.

Every row: check id, statement, method (z3 / exhaustive / hypothesis / mutant), expected, result, seconds.
Exit status 0 only when every theorem has its expected answer (unknown = failure), every
exhaustive and link run found nothing, and every mutant was caught.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Iterator
from typing import Any
from xml.etree import ElementTree as ET

from kvspec.checks.calibration import (
    compute_target,
    format_calibrated,
    format_target,
    measure_calibration,
    measure_cpu_seconds,
)
from kvspec.checks.output import write_output_file
from kvspec.checks.verify.manifest import (
    EXHAUSTIVE_INPUTS,
    LINK_INPUTS,
    Check,
    Method,
    Part,
    Row,
    compute_manifest,
)
from kvspec.checks.verify.prove import SCOPE, measure_z3_calibration
from kvspec.spec.errors import SpecError


def _selected(fast: bool, full: bool, only: tuple[str, ...] = ()) -> list[Check]:
    manifest = compute_manifest(full)
    unmatched = [pat for pat in only if not any(fnmatch.fnmatchcase(r, pat) for c in manifest for r in c.row_ids)]
    if unmatched:  # a mistyped id beside good ones must not pass as a run that checked it
        raise SpecError("verify-only", f"no check matches {' '.join(unmatched)} (kvspec verify --list shows the ids)")
    checks = [c for c in manifest if c.fast or not fast]
    if only:
        checks = [c for c in checks if any(fnmatch.fnmatchcase(r, pat) for r in c.row_ids for pat in only)]
    return checks


Task = tuple[int, int, bool, bool]  # (index of the check in the manifest, index of its part, fast, full)


def compute_tasks(fast: bool = False, only: tuple[str, ...] = (), full: bool = False) -> list[Task]:
    """Return the parts of the selected checks, longest budget first (so both cores finish together)."""
    manifest = compute_manifest(full)
    index = {c.id: k for k, c in enumerate(manifest)}
    tasks = [(index[c.id], j, fast, full) for c in _selected(fast, full, only) for j in range(len(c.parts(fast)))]
    return sorted(tasks, key=lambda t: -manifest[t[0]].budget_s)


def _run_task(task: Task) -> tuple[Task, Part]:
    k, j, fast, full = task
    check = compute_manifest(full)[k]
    return task, check.run(check.parts(fast)[j], fast)


def _progress(check: Check, part: Part, done: int, total: int, t0: float) -> None:
    """Print one line on stderr as a part ends: its check, result, elapsed time, parts left."""
    print(f"verify: [{done}/{total}] {check.id}: {part.summary()} ({part.seconds:.1f} s; "
          f"{time.perf_counter() - t0:.0f} s elapsed, {total - done} parts left)", file=sys.stderr, flush=True)


GC_THRESHOLD = 50_000  # allocations between gen-0 collections (CPython's default: 700)


def _setup_worker() -> None:
    """Make the cyclic garbage collector rare in a worker: the checks allocate millions of short-lived, acyclic values
    (freed by reference counting), and each collection walks the memo tables and verdict maps (≈10% of an exhaustive
    part at the default threshold, measured)."""
    gc.freeze()  # what the manifest and the imports allocated is never garbage
    gc.set_threshold(GC_THRESHOLD, 10, 10)


@contextlib.contextmanager
def _rare_gc() -> Iterator[None]:
    """Run the parts in this process as a worker runs them (_setup_worker), then give the caller its collector back."""
    before = gc.get_threshold()
    _setup_worker()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def collect(fast: bool = False, processes: int | None = None, progress: bool = False,
            only: tuple[str, ...] = (), full: bool = False) -> list[Row]:
    """Return the rows of the selected checks, in manifest order (the parts run on every core)."""
    manifest = compute_manifest(full)
    tasks = compute_tasks(fast, only, full)
    procs = processes or min(len(tasks), os.cpu_count() or 1)
    t0, results = time.perf_counter(), {}
    with mp.get_context("fork").Pool(procs, _setup_worker) if procs > 1 else _rare_gc() as pool:
        for n, (task, part) in enumerate(pool.imap_unordered(_run_task, tasks) if pool is not None
                                         else map(_run_task, tasks), start=1):
            results[task[:2]] = part
            if progress:
                _progress(manifest[task[0]], part, n, len(tasks), t0)
    rows: list[Row] = []
    for k in sorted({t[0] for t in tasks}):
        parts = [results[(k, j)] for j in range(len(manifest[k].parts(fast)))]
        rows.extend(manifest[k].render(parts))
    return rows


def summarize(rows: list[Row], fast: bool) -> dict[str, Any]:
    """Return the report: the rows as JSON objects (checks/README.md documents them) and the totals."""
    z3rows = [r for r in rows if r.method == Method.Z3]
    mutants = [r for r in rows if r.method == Method.MUTANT]
    return {"ok": all(r.ok for r in rows), "fast": fast, "z3_scope": SCOPE, "rows": [r.to_json() for r in rows],
            "totals": {"checks": len(rows), "failed": sum(not r.ok for r in rows), "z3_calls": len(z3rows),
                       "z3_proved": sum(r.result == "proved" for r in z3rows),
                       "z3_refuted": sum(r.result == "refuted" for r in z3rows),
                       "z3_unknown": sum(r.result.startswith("unknown") for r in z3rows),
                       **{t: sum(r.detail["scenarios"] for r in rows if r.tally == t)
                          for t in (EXHAUSTIVE_INPUTS, LINK_INPUTS)},
                       "mutants": len(mutants), "mutants_caught": sum(r.ok for r in mutants),
                       "seconds_by_method": {str(m): round(sum(r.seconds for r in rows if r.method == m), 2)
                                             for m in Method if any(r.method == m for r in rows)},
                       "z3_solver_seconds": round(sum(r.detail["solver_seconds"] for r in z3rows), 2),
                       "z3_units": sum(r.detail["rlimit_total"] for r in z3rows)}}


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
            ce = r["counterexample"] or ""
            shown = ce if ce.startswith("kvspec ") or len(ce) <= 160 else ce[:160] + " … (--json has it whole)"
            lines.append(f"{'':<22} first caught after {r['tried']} scenarios, on: {shown}")
        for f in r.get("failures") or []:
            lines.append(f"{'':<22} FAILURE: {f}")
    t = report["totals"]
    lines.append("")
    lines.append(f"z3 scope of the scenario theorems: {report['z3_scope']}")
    lines.append(f"totals: {t['checks']} checks, {t['failed']} failed; z3 {t['z3_calls']} calls: {t['z3_proved']} proved,"
                 f" {t['z3_refuted']} refuted, {t['z3_unknown']} unknown; exhaustive {t['exhaustive_scenarios']} "
                 f"scenarios; link {t['link_inputs']} inputs; mutants {t['mutants_caught']}/{t['mutants']} caught")
    lines.append(format_time_by_method(report))
    lines.append("VERIFY: OK" if report["ok"] else "VERIFY: FAILED")
    return "\n".join(lines)


def format_time_by_method(report: dict[str, Any]) -> str:
    """Return where the run's time went: each method's seconds summed over its parts (on every core), Z3's own check
    time among the proofs', and what that check time alone costs spread over every core (a floor on the wall time
    of any run that proves the same theorems on this machine: Z3 answers a query on one core)."""
    t = report["totals"]
    by = sorted(t["seconds_by_method"].items(), key=lambda kv: -kv[1])
    words = [f"{m} {s:.1f}" + (f" ({t['z3_solver_seconds']:.1f} inside Z3's check)" if m == str(Method.Z3) else "")
             for m, s in by]
    line = f"time by method (seconds summed over the parts, all cores): {', '.join(words)}"
    cal = report.get("calibration")
    if str(Method.Z3) not in t["seconds_by_method"]:
        return line
    if cal:
        floor = t["z3_solver_seconds"] / cal["cores"]
        line += (f"\nZ3's check alone over {cal['cores']} cores: ≥ {floor:.1f} s wall = "
                 f"{floor / cal['loop_seconds']:.0f} loop units, whatever the rest of the run costs")
    rate = t["z3_units"] / max(t["z3_solver_seconds"], 1e-9) / 1e6
    line += (f"\nZ3's work: {t['z3_units'] / 1e6:.1f}M resource units over every query (the same on any machine "
             f"for the same theorems, seeds and Z3: compare runs by it), checked at {rate:.2f}M units/s")
    if cal and "z3" in cal:
        z = cal["z3"]
        line += (f"; the fixed Z3 query alone before the run: {z['units'] / 1e6:.2f}M units in {z['seconds']} s = "
                 f"{z['units'] / z['seconds'] / 1e6:.1f}M units/s (Z3 {z['z3']}; another mix of work, compare "
                 f"each rate with its own from another run)")
    return line


def format_junit(report: dict[str, Any]) -> str:
    """Return the table as JUnit XML: one testcase per row (classname = method), a failure per failed row."""
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
               only: tuple[str, ...] = (), list_only: bool = False, full: bool = False) -> int:
    """Run everything (or the rows `only` names), print the table (or JSON); return 0 when all checks pass."""
    if list_only:
        for c in _selected(fast, full, only):
            for r in c.row_ids:
                print(f"{r:<36} {type(c).__name__}" + (f" (a pass shared with {c.id})" if r != c.id else ""))
        return 0
    tasks = compute_tasks(fast, only, full)
    if not tasks:
        raise SpecError("verify-only", f"no check matches {' '.join(only)} (kvspec verify --list shows the ids)")
    if junit and os.path.isdir(junit):  # refused before the run, not after it
        raise SpecError("output-file", f"--junit {junit} is a directory; name a file")
    calibration = measure_calibration()  # this machine, measured in the same run (checks/calibration.py)
    calibration["z3"] = measure_z3_calibration()  # and its Z3 speed on a fixed query (prove.py)
    t0, c0 = time.perf_counter(), measure_cpu_seconds()
    report = summarize(collect(fast, progress=progress, only=only, full=full), fast)
    report["wall_seconds"] = round(time.perf_counter() - t0, 2)
    report["cpu_seconds"] = round(measure_cpu_seconds() - c0, 2)
    report["calibration"] = calibration
    whole = not (fast or only or full)  # the target is the whole default run's (checks/calibration.py: TARGETS)
    if whole:
        report["target"] = compute_target("verify", report["wall_seconds"], calibration)
    if junit:
        os.makedirs(os.path.dirname(os.path.abspath(junit)), exist_ok=True)  # creates folders, replaces no file but it
        write_output_file(junit, format_junit(report) + "\n")
    if json_out:
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
        print(format_calibrated(report["wall_seconds"], report["cpu_seconds"], calibration))
        if whole:
            print(format_target("verify", report["wall_seconds"], calibration))
    sys.stdout.flush()
    return 0 if report["ok"] else 1
