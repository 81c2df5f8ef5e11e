"""The Z3 backend of the ops shim (spec/ops.py) and the prover's tactics: quotient variables,
common-factor cancelling, product order lemmas, opaque names.  Moved out of the spec: the spec
states rules; how Z3 is helped to prove them belongs to the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Z3InContext:
    """The z3 module bound to one Z3 context: every term, solver and tactic built through it lives there.

    A theorem gets a context of its own, so its proof does not depend on which theorems the same process
    proved before (Z3's search order follows the ids of the terms its context has made).
    """

    def __init__(self) -> None:
        import z3  # lazy: the spec itself never needs z3

        self._z3 = z3
        self.ctx = z3.Context()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._z3, name)

    # z3's own names, each building in this context
    def Int(self, name: str) -> Any:
        return self._z3.Int(name, self.ctx)

    def Ints(self, names: str) -> Any:
        return self._z3.Ints(names, self.ctx)

    def IntVal(self, value: int) -> Any:
        return self._z3.IntVal(value, self.ctx)

    def Bool(self, name: str) -> Any:
        return self._z3.Bool(name, self.ctx)

    def BoolVal(self, value: bool) -> Any:
        return self._z3.BoolVal(value, self.ctx)

    def And(self, *xs: Any) -> Any:
        return self._z3.And(*xs, self.ctx)

    def Or(self, *xs: Any) -> Any:
        return self._z3.Or(*xs, self.ctx)

    def Not(self, x: Any) -> Any:
        return self._z3.Not(x, self.ctx)

    def Implies(self, a: Any, b: Any) -> Any:
        return self._z3.Implies(a, b, self.ctx)

    def If(self, c: Any, x: Any, y: Any) -> Any:
        return self._z3.If(c, x, y, self.ctx)

    def Predicate(self, name: str) -> Any:
        """Return an uninterpreted predicate over one integer."""
        return self._z3.Function(name, self._z3.IntSort(self.ctx), self._z3.BoolSort(self.ctx))

    def Solver(self) -> Any:
        return self._z3.Solver(ctx=self.ctx)

    def Then(self, *tactics: str) -> Any:
        return self._z3.Then(*tactics, ctx=self.ctx)


class Z3Ops:
    """Build Z3 terms (in a context of their own); divisions record the side condition divisor >= 1."""

    name = "z3"

    def __init__(self, div_vars: bool = False, shared_lets: bool = False) -> None:
        self.z3 = Z3InContext()
        # shared_lets: one name per (name, value) — a quantity built twice (a fact about it in the precondition, the
        # claim that reads it) is then one constant, which a query can leave opaque in both places at once
        self._lets: dict[tuple[str, int], Any] | None = {} if shared_lets else None
        self.rlimit_seen = 0  # the context's resource counter after the last query (see prove._query)
        # div_vars: a division by a non-numeral term gets explicit quotient/remainder variables
        # (a = k·b + r, 0 <= r < b, a definition), which leaves Z3 only multiplications.
        self.div_vars = div_vars
        self.side: list[Any] = []
        self._defining: list[tuple[tuple[str, ...], Any, Any]] = []  # (names it introduces, def, guarded def)
        self.bounded: list[Any] = []
        self._fresh = 0
        self._quotients: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._defined_free: dict[int, frozenset[str]] = {}  # a definition's id -> its free names

    def _define(self, names: tuple[Any, ...], constraint: Any, guard: Any = None) -> None:
        guarded = constraint if guard is None else self.z3.Implies(guard, constraint)
        self._defining.append((tuple(str(n) for n in names), constraint, guarded))

    def compute_free(self, *terms: Any) -> set[str]:
        """Return the names of the uninterpreted constants in terms."""
        z3, seen, out, todo = self.z3, set(), set(), list(terms)
        while todo:
            t = todo.pop()
            if t.get_id() in seen:
                continue
            seen.add(t.get_id())
            if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
                out.add(str(t))
            elif z3.is_app(t):
                todo.extend(t.children())
        return out

    def compute_cone(self, *roots: Any, opaque: frozenset[str] = frozenset()) -> tuple[list[Any], list[Any]]:
        """Return the definitions the roots depend on, plain and guarded.

        Dropping the definitions of names the roots never reach is sound (a definitional
        extension).  Prove the side conditions with the guarded definitions, then the claim with
        the plain ones.  The definitions of the ``opaque`` names are left out too (dropping a
        hypothesis is always sound): what the claim needs of them must come from proved lemmas
        among the roots.
        """
        names = self.compute_free(*roots)
        picked: list[tuple[Any, Any]] = []
        pending = list(self._defining)
        changed = True
        while changed:
            changed, rest = False, []
            for defined, c, guarded in pending:
                if names.intersection(defined) and not opaque.intersection(defined):
                    picked.append((c, guarded))
                    names |= self._compute_defined_free(c)
                    changed = True
                else:
                    rest.append((defined, c, guarded))
            pending = rest
        return [c for c, _ in picked], [g for _, g in picked]

    def _compute_defined_free(self, definition: Any) -> frozenset[str]:
        """Return compute_free of one of the context's definitions, walked once per theorem (every query's cone reads
        the same definitions; they live as long as the context, so their ids are never reused)."""
        k = definition.get_id()
        if k not in self._defined_free:
            self._defined_free[k] = frozenset(self.compute_free(definition))
        return self._defined_free[k]

    def compute_product_lemmas(self, *roots: Any) -> list[Any]:
        """Return ground instances of order facts for every product x·f in roots (valid for all integers).

        For each symbolic factor f and each pair of its multiplicands X, Y (0 included):
        f >= 1 implies (X <= Y iff X·f <= Y·f) and (X < Y iff X·f + f <= Y·f).  Valid formulas, so
        adding them is sound; they give the solver the monotonicity and discreteness of
        multiples that nonlinear integer arithmetic would otherwise have to find.
        """
        z3 = self.z3
        groups: dict[int, tuple[Any, dict[int, Any]]] = {}
        seen: set[int] = set()
        todo = list(roots)
        while todo:
            t = todo.pop()
            if t.get_id() in seen:
                continue
            seen.add(t.get_id())
            if z3.is_app_of(t, z3.Z3_OP_MUL):
                fs = self._factors(t)
                for k, f in enumerate(fs):
                    if not z3.is_int_value(f):
                        rest = self._product(fs[:k] + fs[k + 1:])
                        groups.setdefault(f.get_id(), (f, {}))[1][rest.get_id()] = (rest, t)
            if z3.is_app(t):
                todo.extend(t.children())
        out = []
        for f, ms in groups.values():
            xs = [(z3.IntVal(0), z3.IntVal(0)), *ms.values()]  # (multiplicand, the product term as written)
            for i, (x, tx) in enumerate(xs):
                for y, ty in xs[i + 1:]:
                    out.append(z3.Implies(f >= 1, z3.And((x <= y) == (tx <= ty), (y <= x) == (ty <= tx),
                                                          (x < y) == (tx + f <= ty), (y < x) == (ty + f <= tx))))
        return out

    def _div_guard(self, b: Any) -> None:
        self.side.append(b >= 1)

    def _factors(self, t: Any) -> list[Any]:
        if self.z3.is_app_of(t, self.z3.Z3_OP_MUL):
            return [f for c in t.children() for f in self._factors(c)]
        return [t]

    def _product(self, fs: list[Any]) -> Any:
        out = self.z3.IntVal(1)
        for f in fs:
            out = f if self.z3.is_int_value(out) and out.as_long() == 1 else out * f
        return out

    def _cancel(self, a: Any, b: Any) -> tuple[Any, Any, Any]:
        """Return (f, x, y) with a = f·x and b = f·y syntactically, recording the side condition f >= 1.

        f = 1 (and no side condition) when the two share no symbolic factor.
        """
        fa, rest_b, common = self._factors(a), [], []
        for f in self._factors(b):
            k = next((k for k, g in enumerate(fa) if g.eq(f)), None) if not self.z3.is_int_value(f) else None
            if k is None:
                rest_b.append(f)
            else:
                common.append(fa.pop(k))
        if common:
            self.side.append(self._product(common) >= 1)
        return self._product(common), self._product(fa), self._product(rest_b)

    def _quot_rem(self, a: Any, b: Any) -> tuple[Any, Any]:
        """Return (⌊a/b⌋, a mod b), rewritten by sound identities before any variable is introduced.

        If(c, x, y) / b = If(c, x/b, y/b); (f·x) / (f·y) = x / y with remainder f·(x mod y) for f >= 1
        (f >= 1 becomes a side condition); the same division twice gets the same quotient variables.
        """
        z3 = self.z3
        self._div_guard(b)
        if z3.is_app_of(a, z3.Z3_OP_ITE):
            c, x, y = a.children()
            (kx, rx), (ky, ry) = self._quot_rem(x, b), self._quot_rem(y, b)
            return z3.If(c, kx, ky), z3.If(c, rx, ry)
        f, x, y = self._cancel(a, b)
        if not (z3.is_int_value(f) and f.as_long() == 1):
            if z3.is_int_value(y) and y.as_long() == 1:
                return x, z3.IntVal(0)
            k, r = self._quot_rem(x, y)
            return k, f * r
        if not self.div_vars or z3.is_int_value(z3.simplify(b)):
            return a / b, a % b
        key = (a.get_id(), b.get_id())
        if key not in self._quotients:
            self._fresh += 1
            k, r = z3.Int(f"_q{self._fresh}"), z3.Int(f"_r{self._fresh}")
            # guarded by b >= 1 where the side conditions are proved (a divisor < 1 must fail them, not
            # make the definition unsatisfiable); unguarded where the claim is proved once they hold
            self._define((k, r), z3.And(a == k * b + r, r >= 0, r < b), guard=b >= 1)
            self._quotients[key] = (k, r)
        return self._quotients[key]

    def floordiv(self, a: Any, b: Any) -> Any:
        """Return floor(a / b) (Z3 Int division is floor division for b >= 1)."""
        return self._quot_rem(a, b)[0]

    def cdiv(self, a: Any, b: Any) -> Any:
        """Return ceil(a / b) for b >= 1 (⌈f·x / f·y⌉ = ⌈x/y⌉ for f >= 1; pushed into if-then-else)."""
        self._div_guard(b)
        if self.z3.is_app_of(a, self.z3.Z3_OP_ITE):
            c, x, y = a.children()
            return self.z3.If(c, self.cdiv(x, b), self.cdiv(y, b))
        _, x, y = self._cancel(a, b)
        return self._quot_rem(x + y - 1, y)[0]

    def mod(self, a: Any, b: Any) -> Any:
        """Return a mod b for b >= 1."""
        return self._quot_rem(a, b)[1]

    def min(self, a: Any, b: Any) -> Any:
        """Return the smaller of a and b."""
        return self.z3.If(a <= b, a, b)

    def max(self, a: Any, b: Any) -> Any:
        """Return the larger of a and b."""
        return self.z3.If(a >= b, a, b)

    def If(self, c: Any, x: Any, y: Any) -> Any:
        """Return the term x when c holds, else y."""
        return self.z3.If(c, x, y)

    def And(self, *xs: Any) -> Any:
        """Return the conjunction of xs."""
        return self.z3.And(*xs)

    def Or(self, *xs: Any) -> Any:
        """Return the disjunction of xs."""
        return self.z3.Or(*xs)

    def Not(self, x: Any) -> Any:
        """Return the negation of x."""
        return self.z3.Not(x)

    def Implies(self, a: Any, b: Any) -> Any:
        """Return a => b."""
        return self.z3.Implies(a, b)

    def all_below(self, n: Any, body: Callable[[Any], Any]) -> Any:
        """Return 0 <= i < n => body(i) for a fresh free i (forall i, as every free variable of a goal is).

        Sound only where the result occurs positively in the claim (never in a precondition, never
        under Not or on the left of Implies); the registry's predicates use it that way, and the
        prover rejects preconditions that contain one (``self.bounded`` records them).
        """
        self._fresh += 1
        i = self.z3.Int(f"_i{self._fresh}")
        self.bounded.append(i)
        return self.z3.Implies(self.z3.And(i >= 0, i < n), body(i))

    def divides(self, d: Any, x: Any) -> Any:
        """Return whether d (>= 1) divides x."""
        return self._quot_rem(x, d)[1] == 0

    def pick_below(self, name: str, hi: Any, pred: Callable[[Any], Any], at_least: tuple[Any, ...] = ()) -> Any:
        """Return a fresh variable defined as some t in [1, hi] with pred(t), or 0, and no smaller than any w of
        at_least in [1, hi] with pred(w): the ints backend's largest such t is one choice, so what is proved of every
        choice holds of it (the definition is satisfiable, by the largest: a definitional extension)."""
        self._fresh += 1
        z3, v = self.z3, self.z3.Int(f"{name}_{self._fresh}")
        floor = [z3.Implies(z3.And(w >= 1, w <= hi, pred(w)), v >= w) for w in at_least]
        self._define((v,), z3.And(z3.Or(v == 0, z3.And(v >= 1, v <= hi, pred(v))), *floor))
        return v

    def let(self, name: str, value: Any) -> Any:
        """Return a fresh variable defined equal to value (a definition, see ``compute_cone``); with shared_lets, the
        variable already defined by the same name and value (Z3 terms are hash-consed: equal terms, equal ids)."""
        lets = self._lets
        key = (name, value.get_id()) if lets is not None and hasattr(value, "get_id") else None
        if lets is not None and key is not None and key in lets:
            return lets[key]
        self._fresh += 1
        v = self.z3.Int(f"{name}_{self._fresh}") if not self.z3.is_bool(value) else self.z3.Bool(f"{name}_{self._fresh}")
        self._define((v,), v == value)
        if lets is not None and key is not None:
            lets[key] = v
        return v
