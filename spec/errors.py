"""The one error type of the spec: a violated rule, named."""

from __future__ import annotations


class SpecError(ValueError):
    """A value or scenario outside the spec's domain; ``rule`` names the violated rule."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule
        self.message = message

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        """Return how to rebuild this error (it crosses process pools, where ValueError's default would fail)."""
        return (SpecError, (self.rule, self.message))


def require(condition: bool, rule: str, message: str) -> None:
    """Raise SpecError(rule, message) unless condition holds."""
    if not condition:
        raise SpecError(rule, message)
