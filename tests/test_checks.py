"""The checker can fail: false claims are refuted, unknown is a failure, mutants are caught."""

from __future__ import annotations

from .conftest import require

require("z3")

from kvspec.checks.closed_form import Params, compute_closed_witness, pre_params  # noqa: E402
from kvspec.checks.exhaustive import iterate_all  # noqa: E402
from kvspec.checks.link import compare  # noqa: E402
from kvspec.checks.mutants import MUTANTS, hunt  # noqa: E402
from kvspec.checks.prove import Theorem, compute_theorems, format_explain_command, prove  # noqa: E402
from kvspec.checks.verify import format_table, summarize  # noqa: E402
from kvspec.spec.invariants import get_invariant  # noqa: E402
from kvspec.spec.ops import Z3Ops  # noqa: E402


def _closed_claim(claim):
    def build(ops: Z3Ops):
        z3 = ops.z3
        v = {n: z3.Int(n) for n in ("e", "dense", "p", "n", "s_shared")}
        x = Params(u=z3.IntVal(128), q=z3.IntVal(12), d=z3.IntVal(8), **v)
        return pre_params(ops, x), claim(ops, compute_closed_witness(ops, x)), v
    return build


def test_false_claim_is_refuted_with_a_model():
    th = Theorem(name="FALSE", statement="h < S (false: h = S = 0 happens)",
                 build=_closed_claim(lambda ops, w: w.hit < w.shared), budget_s=10)
    v = prove(th)
    assert v.answer == "refuted" and not v.ok and v.model is not None


def test_unknown_is_a_failure():
    def hard(ops: Z3Ops):
        z3 = ops.z3
        x, y, z, k = z3.Ints("x y z k")
        pre = z3.And(x >= 1, y >= 1, z >= 1, k >= 3, k <= 40)
        return pre, z3.Not(x ** k + y ** k == z ** k), {"x": x, "y": y, "z": z}
    v = prove(Theorem(name="FERMAT", statement="made to time out", build=hard, budget_s=0.3))
    assert v.answer == "unknown" and v.ok is False and v.reason


def test_unknown_counts_as_failure_in_the_table():
    row = {"kind": "z3", "id": "X@g", "statement": "s", "method": "z3", "expected": "proved", "result": "unknown",
           "ok": False, "seconds": 0.3, "rests_on": "-", "budget_s": 0.3, "reason": "timeout"}
    report = summarize([row], fast=True)
    assert report["ok"] is False and "VERIFY: FAILED" in format_table(report)


def test_fast_subset_of_theorems():
    ths = [t for t in compute_theorems() if t.name.endswith("@D8u128b1536")]
    assert {t.name.split("@")[0] for t in ths} >= {"I-12", "I-14", "I-19", "I-20", "LEGACY-I-20"}
    for th in ths:
        v = prove(th)
        assert v.ok, (th.name, v.answer, v.reason)
        if th.expected == "refuted":
            cmd = format_explain_command(v.model)
            assert "--legacy-tail-key" in cmd


def test_legacy_counterexample_command_replays_as_missing_key(capsys):
    from kvspec.checks.cli import main
    th = next(t for t in compute_theorems() if t.name.startswith("LEGACY-I-20"))
    v = prove(th)
    argv = format_explain_command(v.model).split()[1:] + ["--json"]
    assert main(argv) == 0
    import json
    d = json.loads(capsys.readouterr().out)
    assert any(not e["present"] for e in d["load"])


def test_every_mutant_is_caught_quickly():
    for m in MUTANTS:
        caught, sc, n = hunt(m, iterate_all(dcps=(2, 8)))
        assert caught, m.name


def test_link_on_the_worked_example():
    assert compare(Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000)) is None
    assert compare(Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000), draft=True) is None


def test_registry_predicate_is_shared_by_both_backends():
    from kvspec.spec.ops import IntOps
    w = compute_closed_witness(IntOps, Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000))
    assert w.hit == 13824 and get_invariant("I-20").predicate(IntOps, w)
    legacy = compute_closed_witness(IntOps, Params(u=128, q=12, d=8, e=1, dense=0, p=15000, n=15000, s_shared=15000),
                                    legacy=True)
    assert not get_invariant("I-20").predicate(IntOps, legacy)


def test_spurious_models_are_not_counterexamples():
    """A 'sat' whose model satisfies the claim on ints is rejected (never reported as refuted)."""
    def build(ops: Z3Ops):
        z3 = ops.z3
        x = z3.Int("x")
        return x >= 0, x < 0, {"x": x}  # refuted for real at any x >= 0 ...
    th = Theorem(name="SPURIOUS", statement="replay says the model is no counterexample", build=build, budget_s=5,
                 replay=lambda model: False)  # ... but the replay disagrees: fail closed
    v = prove(th)
    assert v.answer == "unknown" and not v.ok and "spurious" in v.reason
