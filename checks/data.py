"""Where kvspec's data files are: the JSON schemas and the committed test vectors.

In a wheel they are package data (``kvspec/schemas``, ``kvspec/vectors``); in a checkout they are the
repository's top-level ``schemas/`` and ``vectors/``. Both are found the same way, so `conform --adapter`
reads the committed vectors from an installed kvspec instead of regenerating them.
"""

from __future__ import annotations

from pathlib import Path

import kvspec


def find_data_dir(name: str) -> Path | None:
    """Return the folder `name` (schemas or vectors) of this kvspec, in the wheel or in the checkout; None if absent."""
    here = Path(kvspec.__file__).resolve().parent
    for candidate in (here / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    return None


def find_vector_cases(rules: str, runner: str = "explain", handler: str = "outcome") -> Path | None:
    """Return the folder of one rule set's committed vectors of a runner/handler, or None when not shipped."""
    root = find_data_dir("vectors")
    if root is None:
        return None
    path = root / "cases" / rules / runner / handler
    return path if path.is_dir() else None
