"""`make verify` as a runner: the table fails on any failed row, --list / --only / --junit, a row that checked nothing
fails, every mutant of the table is caught."""

from __future__ import annotations

from .conftest import require

require("z3")

from kvspec.checks.verify.exhaustive import iterate_all  # noqa: E402
from kvspec.checks.verify.mutants import MUTANTS, hunt  # noqa: E402
from kvspec.checks.verify.runner import format_table, summarize  # noqa: E402


def test_unknown_counts_as_failure_in_the_table():
    from kvspec.checks.verify.manifest import Method, Row
    row = Row(id="X@g", statement="s", method=Method.Z3, expected="proved", result="unknown FAIL", ok=False, seconds=0.3,
              detail={"rests_on": "-", "budget_s": 0.3, "reason": "timeout", "precondition": "-", "queries": 2,
                      "rlimit": 200_000, "rlimit_used": 200_000, "solver_seconds": 0.26, "rlimit_total": 250_000})
    report = summarize([row], fast=True)
    assert report["ok"] is False and "VERIFY: FAILED" in format_table(report)
    assert "time by method (seconds summed over the parts, all cores): z3 0.3 (0.3 inside Z3's check)" in \
        format_table(report)  # no calibration in the report: no floor line
    assert "Z3's check alone" not in format_table(report)
    assert "Z3's work: 0.2M resource units" in format_table(report) and "checked at 0.96M units/s" in \
        format_table(report) and "fixed Z3 query" not in format_table(report)  # no calibration in the report



def test_every_mutant_is_caught_quickly():
    """Scenario mutants by the registry on the scope; closure mutants are hunted over failed loads
    (tests/test_failure.py, make verify's MUT-closure-* rows)."""
    for m in MUTANTS:
        if not m.closure:
            caught, sc, n = hunt(m, iterate_all(dcps=(2, 8)))
            assert caught, m.name


def test_verify_only_list_and_junit(tmp_path, capsys):
    """--list names every row; --only runs the rows it matches; --junit writes one testcase per row."""
    import xml.etree.ElementTree as ET

    import pytest

    from kvspec.checks.cli.main import main
    assert main(["verify", "--list"]) == 0
    ids = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert {"EXHAUSTIVE", "LEGACY-I-20", "FAIL-exhaustive", "MUT-legacy-tail-key", "MUT-closure-keeps-hit"} <= set(ids)
    junit = tmp_path / "r" / "verify.xml"
    assert main(["verify", "--only", "MUT-legacy-tail-key", "I-6", "--junit", str(junit)]) == 0
    out, err = capsys.readouterr()
    assert "VERIFY: OK" in out and "verify: [2/2]" in err  # a progress line per task
    assert "target (issue 30)" not in out  # a few rows are not held to the whole run's target
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "0"
    assert sorted(c.get("name") for c in suite.iter("testcase")) == ["I-6", "MUT-legacy-tail-key"]
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--only", "NO-SUCH-CHECK"])
    assert exc.value.code == 2 and "verify-only" in capsys.readouterr().err
    for args in (["--only", "I-6", "NO-SUCH-CHECK"], ["--list", "--only", "I-6", "NO-SUCH-*"]):  # one good id beside
        with pytest.raises(SystemExit) as exc:
            main(["verify", *args])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "verify-only: no check matches NO-SUCH-" in err and "I-6" not in err


def test_a_row_that_checked_nothing_fails():
    """An exhaustive, link or property row over no input shows nothing: it fails instead of passing."""
    from kvspec.checks.verify.exhaustive import SCOPE_SMALL
    from kvspec.checks.verify.link import LINK_SCOPE
    from kvspec.checks.verify.manifest import Count, ExhaustiveCheck, LinkCheck, PassPart, PropertyCheck
    nothing = PassPart(rows=(Count(),))  # a pass over one scope that met no input
    assert not ExhaustiveCheck(rows=(("E", SCOPE_SMALL),)).render([nothing])[0].ok
    assert not LinkCheck(rows=(("L", "lookup"),), scope=LINK_SCOPE).render([nothing])[0].ok
    no_instance = PassPart(rows={"vllm-0.33.0": Count()})
    assert not PropertyCheck(prop="RESEND", rows=(("vllm-0.33.0", "holds", None),)).render([no_instance])[0].ok
    assert ExhaustiveCheck(rows=(("E", SCOPE_SMALL),)).render([PassPart(rows=(Count(n=1),))])[0].ok


def test_a_shared_pass_is_listed_by_row_and_selected_by_any_of_its_rows(capsys):
    """--list names each row of a shared pass (the rule sets' rows of one check); --only with any one of them selects
    the whole pass, whose parts render one row per rule set."""
    from kvspec.checks.cli.main import main
    from kvspec.checks.verify.manifest import compute_manifest
    from kvspec.checks.verify.runner import compute_tasks
    assert main(["verify", "--list", "--only", "EXHAUSTIVE/vllm-0.33.0", "LINK-failure-vllm-0.33.0"]) == 0
    listed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert listed == ["EXHAUSTIVE", "EXHAUSTIVE/vllm-0.33.0", "EXHAUSTIVE/vllm-0.34.0", "EXHAUSTIVE/sglang-0.5.23",
                      "LINK-vllm-0.33.0", "LINK-failure-vllm-0.33.0"]
    manifest = compute_manifest()
    picked = {manifest[k].id for k, _, _, _ in compute_tasks(only=("FAIL-exhaustive/vllm-0.33.0-lookahead",))}
    assert picked == {"FAIL-exhaustive"}
    fail = next(c for c in manifest if c.id == "FAIL-exhaustive")
    assert fail.row_ids == ("FAIL-exhaustive", "FAIL-exhaustive/vllm-0.33.0", "FAIL-exhaustive/vllm-0.33.0-lookahead")


def test_each_check_returns_a_typed_part_with_its_own_summary():
    """Issue 27: a part is a typed value (a theorem's verdict, a pass's counts, a mutant's hunt), each with its own
    progress summary; a row says which report total it adds to (not its id's prefix)."""
    from kvspec.checks.verify.manifest import (
        EXHAUSTIVE_INPUTS,
        LINK_INPUTS,
        Count,
        MutantPart,
        PassPart,
        TheoremPart,
        compute_manifest,
    )
    from kvspec.checks.verify.runner import collect, summarize
    assert TheoremPart(answer="proved", ok=True, seconds=1.0, queries=2, rlimit_used=3, reason=None,
                       model=None).summary() == "proved"
    assert PassPart(rows=(Count(n=3, bad=["x"]), Count(n=4))).summary() == "7 checked, 1 counterexamples"
    assert PassPart(rows={"a": Count(n=2, seconds=0.5)}).seconds == 0.5
    assert MutantPart(caught_by=(), tried=9, seconds=0.0, counterexample=None).summary() == "not caught"
    rows = collect(fast=True, processes=1, only=("LINK-best", "EXHAUSTIVE/vllm-0.34.0", "FAIL-exhaustive"))
    tallies = {r.id: r.tally for r in rows}
    assert tallies["LINK-best"] == LINK_INPUTS and tallies["EXHAUSTIVE/vllm-0.34.0"] == EXHAUSTIVE_INPUTS
    assert tallies["FAIL-exhaustive"] is None  # load results, not scenarios: no total of its own
    totals = summarize(rows, fast=True)["totals"]
    assert totals["link_inputs"] == next(r.detail["scenarios"] for r in rows if r.id == "LINK-best") > 0
    assert totals["exhaustive_scenarios"] == sum(r.detail["scenarios"] for r in rows if r.id.startswith("EXHAUSTIVE"))
    assert "tally" not in summarize(rows, fast=True)["rows"][0]
    assert len({type(c).__name__ for c in compute_manifest()}) >= 6


def test_a_whole_run_is_held_to_its_target(monkeypatch, capsys):
    """The whole default run prints its target in loop units and whether it met it (JSON: `target`); the rows are
    stood in by one cheap row here (the target line is what is tested, not the manifest)."""
    import json

    from kvspec.checks.calibration import TARGETS
    from kvspec.checks.verify import runner
    real = runner.collect
    monkeypatch.setattr(runner, "collect", lambda *a, **k: real(fast=True, processes=1, only=("I-6",)))
    assert runner.run_verify(json_out=True, progress=False) == 0
    report = json.loads(capsys.readouterr().out)
    t = report["target"]
    assert t["wall_loop_units"] == TARGETS["verify"].wall_units == 120
    assert t["met"] == (t["measured"] <= 120) and t["measured"] == round(
        report["wall_seconds"] / report["calibration"]["loop_seconds"])
    tot, row = report["totals"], report["rows"][0]
    assert set(tot["seconds_by_method"]) == {"z3"} and tot["seconds_by_method"]["z3"] == round(row["seconds"], 2)
    assert 0 < row["solver_seconds"] <= row["seconds"] and tot["z3_solver_seconds"] == round(row["solver_seconds"], 2)
    # Z3's work in resource units: every query's, at least the largest one's (deterministic: the test below)
    assert tot["z3_units"] == row["rlimit_total"] >= row["rlimit_used"] > 0
    z = report["calibration"]["z3"]
    assert z["seconds"] > 0 and z["units"] > 0 and z["z3"]
    assert runner.run_verify(progress=False) == 0
    out = capsys.readouterr().out
    assert "target (issue 30): make verify ≤ 120 wall loop units" in out
    assert "time by method (seconds summed over the parts, all cores): z3 " in out and "inside Z3's check" in out
    assert "Z3's check alone over" in out
    assert f"Z3's work: {row['rlimit_total'] / 1e6:.1f}M resource units" in out and "M units/s" in out
    assert "the fixed Z3 query alone before the run" in out


def test_z3_work_and_calibration_are_machine_independent_counts():
    """The fixed calibration query and a theorem take the same resource units every time (only their seconds vary
    with the machine); a theorem's total counts every query it posed, the attempts that gave up included."""
    import attrs

    from kvspec.checks.verify.prove import compute_theorems, measure_z3_calibration, prove
    a, b = measure_z3_calibration(), measure_z3_calibration()
    assert a["units"] == b["units"] > 100_000
    th = {t.name: t for t in compute_theorems()}["F-1/z3"]
    v1, v2 = prove(th), prove(th)
    assert v1.answer == v2.answer == "proved" and v1.queries >= 2
    assert v1.rlimit_total == v2.rlimit_total > v1.rlimit_used > 0  # the sum over its queries, not the largest
    starved = prove(attrs.evolve(th, rlimit=8))  # each solver of the portfolio gives up on the first query
    assert starved.answer == "unknown" and starved.queries == 2 and starved.rlimit_total > starved.rlimit_used


def test_the_timer_runs_a_command_and_prints_its_figure_against_its_target(capsys):
    """`python3 checks/calibration.py --target NAME -- CMD` (make test, .ci/run): the command's exit code, its wall and
    CPU time with the calibration, and the target met or not."""
    import sys

    from kvspec.checks.calibration import format_target, main
    cal = {"loop_seconds": 0.5}
    assert format_target("test", 359.0, cal).endswith("718 — met")
    assert format_target("test", 361.0, cal).endswith("722 — NOT met")
    assert format_target("ci", 720.0, cal).endswith("1440 — met")
    assert main(["--target", "test", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("make test: wall ") and "calibration loop" in out and "target (issue 30): make test" in out
