"""Z3 theorems over the invariant registry: fail closed (unknown or timeout is a failure).

Each theorem: a stable name, its precondition, the expected answer (proved | refuted), a
time budget, and what it rests on.  A claim is posed as "is there an assignment satisfying
the precondition where the claim (or a division's side condition) is false?": unsat means
proved, sat gives a counterexample, unknown fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from kvspec.spec.invariants import REGISTRY, get_invariant
from kvspec.spec.ops import IntOps, Z3Ops

from .closed_form import Params, compute_closed_witness, pre_params


@attrs.frozen(kw_only=True)
class Theorem:
    """A named claim with its precondition, expected answer and budget."""

    name: str
    statement: str
    build: Callable[[Z3Ops], tuple[Any, Any, dict[str, Any]]]  # -> (pre, claim, variables)
    expected: str = "proved"  # or "refuted"
    budget_s: float = 20.0
    rests_on: str = "z3 alone"
    replay: Callable[[dict[str, int]], bool] | None = None  # on ints: does the claim fail at this model?
    div_vars: bool = False  # quotient variables for divisions by symbolic terms (see Z3Ops)


@attrs.frozen(kw_only=True)
class Verdict:
    """What the solver answered for one theorem."""

    theorem: Theorem
    answer: str  # proved | refuted | unknown
    ok: bool
    seconds: float
    model: dict[str, int] | None = None
    reason: str = ""


def _ints(ops: Z3Ops, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: ops.z3.Int(n) for n in names}


# Divisibility preconditions of the arithmetic invariants, stated by construction (x = d·k) for Z3:
# nonlinear `mod` facts in a hypothesis defeat the solver, multipliers do not.  The precondition
# predicate is still asserted on the constructed values.
CONSTRUCTIONS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], dict[str, Any]], Any]] = {
    "I-1/2": (("u", "ka", "km", "d", "la", "lm"),
              lambda v: {"u": v["u"], "ba": v["u"] * v["ka"], "bm": v["u"] * v["km"], "d": v["d"],
                         "lcm": v["u"] * v["ka"] * v["d"] * v["la"]},
              lambda v: v["u"] * v["ka"] * v["d"] * v["la"] == v["u"] * v["km"] * v["lm"]),
    "I-6": (("u", "k", "t", "i"), lambda v: {"u": v["u"], "s": v["u"] * v["k"], "tail": v["u"] * v["t"], "i": v["i"]},
            None),
}


def _arith(inv_id: str) -> Callable[[Z3Ops], tuple[Any, Any, dict[str, Any]]]:
    inv = get_invariant(inv_id)

    def build(ops: Z3Ops) -> tuple[Any, Any, dict[str, Any]]:
        assert inv.pre is not None
        if inv_id in CONSTRUCTIONS:
            names, make, extra = CONSTRUCTIONS[inv_id]
            free = _ints(ops, names)
            v = make(free)
            pre = inv.pre(ops, **v)
            if extra is not None:
                pre = ops.And(pre, extra(free))
            return pre, inv.predicate(ops, **v), free
        v = _ints(ops, inv.variables)
        return inv.pre(ops, **v), inv.predicate(ops, **v), v

    return build


PARAM_NAMES = ("e", "dense", "p", "n", "s_shared")
# Geometry grid of the scenario theorems: prompt lengths P, N, S and e, retention are symbolic and
# unbounded; (D, u, b = q·u) range over this grid.  Fully symbolic geometry makes the closed form
# nonlinear (products and divisions of variables) and Z3 answers unknown, which we never count.
GRID_D = (1, 2, 4, 8)
GRID_UQ = ((1, 1), (1, 2), (2, 3), (128, 12))


def compute_grid(dcps: tuple[int, ...] = GRID_D) -> tuple[tuple[int, int, int], ...]:
    """Return the (D, u, q) geometries the scenario theorems are proved on."""
    return tuple((d, u, q) for d in dcps for u, q in GRID_UQ)


def _scenario(inv_id: str, geom: tuple[int | None, int, int], legacy: bool = False, draft: bool = False
              ) -> Callable[[Z3Ops], tuple[Any, Any, dict[str, Any]]]:
    """Return the builder of a scenario theorem; a geometry (None, u, q) leaves D symbolic (D >= 1)."""
    inv = get_invariant(inv_id)
    d, u, q = geom

    def build(ops: Z3Ops) -> tuple[Any, Any, dict[str, Any]]:
        v = _ints(ops, PARAM_NAMES)
        geo = {"u": ops.z3.IntVal(u), "q": ops.z3.IntVal(q),
               "d": ops.z3.Int("d") if d is None else ops.z3.IntVal(d)}
        x = Params(**geo, **v)
        return pre_params(ops, x), inv.predicate(ops, compute_closed_witness(ops, x, legacy=legacy, draft=draft)), \
            {**v, **geo}

    return build


def _replay_scenario(inv_id: str, legacy: bool = False, draft: bool = False,
                     extra: Callable[[dict[str, int]], bool] | None = None) -> Callable[[dict[str, int]], bool]:
    inv = get_invariant(inv_id)

    def replay(model: dict[str, int]) -> bool:
        x = Params(**{k: model[k] for k in ("u", "q", "d", "e", "dense", "p", "n", "s_shared")})
        if not pre_params(IntOps, x) or (extra is not None and not extra(model)):
            return False
        return not inv.predicate(IntOps, compute_closed_witness(IntOps, x, legacy=legacy, draft=draft))

    return replay


def _replay_arith(inv_id: str) -> Callable[[dict[str, int]], bool]:
    inv = get_invariant(inv_id)

    def replay(model: dict[str, int]) -> bool:
        v = CONSTRUCTIONS[inv_id][1](model) if inv_id in CONSTRUCTIONS else model
        try:
            return bool(inv.pre(IntOps, **v)) and not inv.predicate(IntOps, **v)  # type: ignore[misc]
        except AssertionError:  # a divisor < 1: outside the precondition
            return False

    return replay


CLOSED = "closed form (checks/closed_form.py); link closed form == spec fixed point (exhaustive + hypothesis)"
CLOSED_DRAFT = CLOSED + "; link with an equal-spec draft group"
SCOPE = "D∈{1,2,4,8} × (u,b)∈{(1,1),(1,2),(2,6),(128,1536)}; P, N, S, EAGLE, retention unbounded"


def compute_theorems() -> tuple[Theorem, ...]:
    """Return every theorem `make verify` proves or refutes (scenario ones once per grid geometry)."""
    out = [Theorem(name=f"{inv.id}", statement=inv.statement + " [all integers]", build=_arith(inv.id),
                   budget_s=30.0, replay=_replay_arith(inv.id)) for inv in REGISTRY if inv.kind == "arith"]
    for geom in compute_grid():
        tag = "D{}u{}b{}".format(geom[0], geom[1], geom[1] * geom[2])
        for inv in REGISTRY:
            if inv.kind == "scenario":
                out.append(Theorem(name=f"{inv.id}@{tag}", statement=inv.statement, build=_scenario(inv.id, geom),
                                   budget_s=20.0, rests_on=CLOSED, replay=_replay_scenario(inv.id)))
        out.append(Theorem(name=f"I-20/draft@{tag}", statement="every load key is stored, equal-spec draft group",
                           build=_scenario("I-20", geom, draft=True), budget_s=20.0, rests_on=CLOSED_DRAFT,
                           replay=_replay_scenario("I-20", draft=True)))
        if geom[0] == 1:
            out.append(Theorem(name=f"LEGACY-D1-SAFE@{tag}", statement="legacy tail key is safe without DCP "
                               "(D = 1, equal block sizes)", build=_scenario("I-20", geom, legacy=True),
                               budget_s=20.0, rests_on=CLOSED, replay=_replay_scenario("I-20", legacy=True)))
    # Every D at once (D symbolic, unbounded) for the deployment's (u, b), where Z3 manages it with quotient
    # variables; the tail theorems (I-18, I-19, I-20, I-22) answer unknown this way and stay on the grid.
    for inv_id in ("I-12", "I-SHARED", "I-14"):
        inv = get_invariant(inv_id)
        out.append(Theorem(name=f"{inv_id}/every-D@u128b1536", statement=inv.statement + " [u=128, b=1536, every D >= 1]",
                           build=_scenario(inv_id, (None, 128, 12)), budget_s=20.0, rests_on=CLOSED,
                           replay=_replay_scenario(inv_id), div_vars=True))
    out.append(Theorem(name="LEGACY-I-20@D8u128b1536", statement="legacy rule (tail keyed at h): every load key is "
                       "stored", build=_scenario("I-20", (8, 128, 12), legacy=True), expected="refuted",
                       budget_s=20.0, rests_on=CLOSED, replay=_replay_scenario("I-20", legacy=True)))
    return tuple(out)


def _solvers(z3: Any) -> list[Any]:
    # A portfolio: a preprocessing pipeline that turns nested if-then-else into linear case splits,
    # then the default solver.  Any definite answer counts; unknown from both is a failure.
    return [z3.Then("simplify", "propagate-values", "solve-eqs", "purify-arith", "elim-term-ite", "lia2card",
                    "smt").solver(), z3.Solver()]


def prove(th: Theorem, timeout_s: float | None = None) -> Verdict:
    """Return the verdict of one theorem; unknown and timeouts are failures."""
    t0 = time.perf_counter()
    budget = timeout_s if timeout_s is not None else th.budget_s
    reasons = []
    for k in range(2):
        ops = Z3Ops(div_vars=th.div_vars)
        z3 = ops.z3
        pre, claim, variables = th.build(ops)
        solver = _solvers(z3)[k]
        solver.set("timeout", max(1, int(1000 * (budget - (time.perf_counter() - t0)) / (2 - k))))
        solver.add(pre, *ops.defs)
        solver.add(z3.Or(z3.Not(claim), z3.Not(z3.And(*ops.side)) if ops.side else z3.BoolVal(False)))
        res = solver.check()
        if res == z3.unsat:
            return Verdict(theorem=th, answer="proved", ok=th.expected == "proved", seconds=time.perf_counter() - t0)
        if res == z3.sat:
            m = solver.model()
            model = {n: m.eval(v, model_completion=True).as_long() for n, v in variables.items()}
            if th.replay is not None and not th.replay(model):  # a model that is no counterexample on ints
                reasons.append(f"spurious model {model}")
                continue
            return Verdict(theorem=th, answer="refuted", ok=th.expected == "refuted",
                           seconds=time.perf_counter() - t0, model=model)
        reasons.append(str(solver.reason_unknown()))
    return Verdict(theorem=th, answer="unknown", ok=False, seconds=time.perf_counter() - t0, reason="; ".join(reasons))


def format_explain_command(model: dict[str, int]) -> str:
    """Return the `kvspec explain` command that replays a closed-form counterexample."""
    b = model["q"] * model["u"]
    eagle = ":eagle" if model["e"] else ""
    return (f"kvspec explain --dcp {model['d']} --unit {model['u']} --group attention:{b}{eagle} "
            f"--group mamba:{b} --retention {'dense' if model['dense'] else 'replay'} "
            f"--stored-prompt {model['p']} --prompt {model['n']} --shared {model['s_shared']} --legacy-tail-key")
