"""Arithmetic shim: one invariant predicate, two backends (Python ints and Z3 terms).

Inside a predicate use ``ops.*`` for everything whose meaning differs between Python and
Z3 (division, modulo, min/max, conditionals, boolean connectives, bounded quantifiers);
bare ``+ - *`` and comparisons only.  Every divisor must be >= 1: IntOps asserts it, the Z3
backend (``kvspec.checks.verify.z3ops.Z3Ops``, with the prover's tactics) records it as a side
condition that the prover must show is implied by the precondition.  The spec itself never
imports z3.
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
    def If(c: bool, x: Any, y: Any) -> Any:
        """Return x when c holds, else y."""
        return x if c else y

    @staticmethod
    def And(*xs: bool) -> bool:
        """Return the conjunction of xs."""
        return all(xs)

    @staticmethod
    def Or(*xs: bool) -> bool:
        """Return the disjunction of xs."""
        return any(xs)

    @staticmethod
    def Not(x: bool) -> bool:
        """Return the negation of x."""
        return not x

    @staticmethod
    def Implies(a: bool, b: bool) -> bool:
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
    def pick_below(name: str, hi: int, pred: Callable[[int], bool], at_least: tuple[int, ...] = ()) -> int:
        """Return the largest t in [1, hi] with pred(t), else 0 (Z3Ops: some such t, or 0, and >= each w of at_least
        in [1, hi] with pred(w))."""
        return next((t for t in range(hi, 0, -1) if pred(t)), 0)

    @staticmethod
    def let(name: str, value: Any) -> Any:
        """Return value (Z3Ops names it with a fresh variable)."""
        return value
