"""kvspec: the executable reference for hybrid-DCP KV-cache store and load keys (Mooncake Store).

Subpackages: ``kvspec.spec`` (the pure spec), ``kvspec.checks`` (proofs, checks, CLI),
``kvspec.impl`` (the torch implementation on a real store). They live in the repository's
top-level folders spec/, checks/ and impl/.
"""

from __future__ import annotations

import os
from importlib import metadata

try:
    __version__ = metadata.version("kvspec")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

# In a source tree the subpackages are the sibling folders spec/, checks/, impl/ (the wheel puts them
# inside this package): let the import system find them there too.
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_root, "spec")) and not os.path.isdir(os.path.join(os.path.dirname(__file__), "spec")):
    __path__.append(_root)

__all__ = ["__version__"]
