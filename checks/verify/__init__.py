"""`kvspec verify`: every row of `make verify` — Z3 theorems, exhaustive scopes, links, mutants, efficiency.

- ``manifest``: the checks (one ``Check`` value each: parts, run, render) and the rows they yield; add a check here.
- ``runner``: runs the manifest's parts on every core, the table / JSON / JUnit output, the calibration figure.
- ``prove`` and ``z3ops``: the theorems and the fail-closed prover (``unknown`` or a timeout is a failure; a model
  is replayed on integers before it counts as a counterexample); ``z3ops`` is the Z3 backend of spec/ops.py.
- ``closed_form`` and ``link``: the closed forms the theorems are stated over, and their link to the executable spec.
- ``exhaustive``: the bounded scopes (``Scope``: geometries, prompts, evictions, sampling) the exhaustive rows walk.
- ``mutants``: the spec's known-wrong variants, each of which some row must catch.
- ``efficiency``: the cache-efficiency properties (MAX-HIT, BEST, MONO-*) on integers.
"""
