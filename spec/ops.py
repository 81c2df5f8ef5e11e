"""Arithmetic shim: one invariant predicate, two backends (Python ints and Z3 terms).

Inside a predicate use ``ops.*`` for everything whose meaning differs between Python and
Z3 (division, modulo, min/max, conditionals, boolean connectives, bounded quantifiers);
bare ``+ - *`` and comparisons only.  Every divisor must be >= 1: IntOps asserts it, Z3Ops
records it as a side condition that the prover must show is implied by the precondition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class IntOps:
    """Evaluate predicates on Python ints and bools."""

    name = "int"

    @staticmethod
    def floordiv(a: int, b: int) -> int:
        """Return floor(a / b) for b >= 1."""
        assert b >= 1, f"divisor {b} < 1"
        return a // b

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        """Return ceil(a / b) for b >= 1."""
        assert b >= 1, f"divisor {b} < 1"
        return -((-a) // b)

    @staticmethod
    def mod(a: int, b: int) -> int:
        """Return a mod b in [0, b) for b >= 1."""
        assert b >= 1, f"divisor {b} < 1"
        return a % b

    @staticmethod
    def min(a: Any, b: Any) -> Any:
        """Return the smaller of a and b."""
        return a if a <= b else b

    @staticmethod
    def max(a: Any, b: Any) -> Any:
        """Return the larger of a and b."""
        return a if a >= b else b

    @staticmethod
    def If(c: bool, x: Any, y: Any) -> Any:  # noqa: N802 - mirrors z3.If
        """Return x when c holds, else y."""
        return x if c else y

    @staticmethod
    def And(*xs: bool) -> bool:  # noqa: N802
        """Return the conjunction of xs."""
        return all(xs)

    @staticmethod
    def Or(*xs: bool) -> bool:  # noqa: N802
        """Return the disjunction of xs."""
        return any(xs)

    @staticmethod
    def Not(x: bool) -> bool:  # noqa: N802
        """Return the negation of x."""
        return not x

    @staticmethod
    def Implies(a: bool, b: bool) -> bool:  # noqa: N802
        """Return whether a implies b."""
        return (not a) or b

    @staticmethod
    def all_below(n: int, body: Callable[[int], bool]) -> bool:
        """Return whether body(i) holds for every 0 <= i < n."""
        return all(body(i) for i in range(n))

    @staticmethod
    def divides(d: int, x: int) -> bool:
        """Return whether d (>= 1) divides x."""
        assert d >= 1, f"divisor {d} < 1"
        return x % d == 0

    @staticmethod
    def let(name: str, value: Any) -> Any:
        """Return value (Z3Ops names it with a fresh variable)."""
        return value


class Z3Ops:
    """Build Z3 terms; divisions record the side condition divisor >= 1."""

    name = "z3"

    def __init__(self, div_vars: bool = False) -> None:
        import z3  # lazy: the spec itself never needs z3

        self.z3 = z3
        # div_vars: a division by a non-numeral term gets explicit quotient/remainder variables
        # (a = k·b + r, 0 <= r < b, recorded in self.defs), which leaves Z3 only multiplications.
        self.div_vars = div_vars
        self.side: list[Any] = []
        self.defs: list[Any] = []
        self.bounded: list[Any] = []
        self._fresh = 0

    def _div_guard(self, b: Any) -> None:
        self.side.append(b >= 1)

    def _quot_rem(self, a: Any, b: Any) -> tuple[Any, Any]:
        self._div_guard(b)
        if not self.div_vars or self.z3.is_int_value(self.z3.simplify(b)):
            return a / b, a % b
        self._fresh += 1
        k, r = self.z3.Int(f"_q{self._fresh}"), self.z3.Int(f"_r{self._fresh}")
        self.defs += [a == k * b + r, r >= 0, r < b]
        return k, r

    def floordiv(self, a: Any, b: Any) -> Any:
        """Return floor(a / b) (Z3 Int division is floor division for b >= 1)."""
        return self._quot_rem(a, b)[0]

    def cdiv(self, a: Any, b: Any) -> Any:
        """Return ceil(a / b) for b >= 1."""
        return self._quot_rem(a + b - 1, b)[0]

    def mod(self, a: Any, b: Any) -> Any:
        """Return a mod b for b >= 1."""
        return self._quot_rem(a, b)[1]

    def min(self, a: Any, b: Any) -> Any:
        """Return the smaller of a and b."""
        return self.z3.If(a <= b, a, b)

    def max(self, a: Any, b: Any) -> Any:
        """Return the larger of a and b."""
        return self.z3.If(a >= b, a, b)

    def If(self, c: Any, x: Any, y: Any) -> Any:  # noqa: N802
        """Return the term x when c holds, else y."""
        return self.z3.If(c, x, y)

    def And(self, *xs: Any) -> Any:  # noqa: N802
        """Return the conjunction of xs."""
        return self.z3.And(*xs)

    def Or(self, *xs: Any) -> Any:  # noqa: N802
        """Return the disjunction of xs."""
        return self.z3.Or(*xs)

    def Not(self, x: Any) -> Any:  # noqa: N802
        """Return the negation of x."""
        return self.z3.Not(x)

    def Implies(self, a: Any, b: Any) -> Any:  # noqa: N802
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

    def let(self, name: str, value: Any) -> Any:
        """Return a fresh variable defined equal to value (the definition goes to ``self.defs``)."""
        self._fresh += 1
        v = self.z3.Int(f"{name}_{self._fresh}") if not self.z3.is_bool(value) else self.z3.Bool(f"{name}_{self._fresh}")
        self.defs.append(v == value)
        return v
