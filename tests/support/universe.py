"""The stateful machines' small universe of prompts sharing prefixes (so hits and collisions happen),
and what the spec expects a lookup of one of them to find in the model store."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvspec.impl.worker import make_tokens
from kvspec.spec.keys import compute_hash_chain
from kvspec.spec.lookup import compute_lookup, compute_tail_boundaries
from kvspec.spec.model import compute_present_in_chain
from kvspec.spec.plan import plan_load

BASE = make_tokens(1, 256)
UNIVERSE = [(120, 120, 0), (120, 97, 0), (120, 113, 0), (96, 120, 1), (64, 100, 1), (40, 73, 0), (120, 64, 0)]
prompts = st.one_of(st.sampled_from(UNIVERSE), st.tuples(st.sampled_from([0, 24, 40, 64, 96]), st.integers(1, 120),
                                                         st.integers(0, 1)))


def tokens_of(shared: int, length: int, branch: int) -> list[int]:
    """Return a prompt of `length` tokens whose first `shared` are the universe's common prefix."""
    shared = min(shared, length)
    return BASE[:shared] + make_tokens(100 + branch, length - shared, 1000, 2000)


def spec_expectation(g: Any, expected: Any, toks: list[int], rules: str = "pr53324") -> tuple[Any, ...]:
    """Return (chain, E, h, tails, plan): what the spec says a lookup of toks finds in the model store under a rule
    set (its geometry and hash lookahead λ: the chain names [0, t + λ))."""
    from kvspec.spec.keys import compute_lookahead_chain
    from kvspec.spec.rules import compute_lookahead, compute_rule_geometry, get_rules
    rs = get_rules(rules)
    lam, rg = compute_lookahead(rs, g), compute_rule_geometry(rs, g)
    chain = compute_lookahead_chain(toks, g.unit, lam) if lam else compute_hash_chain(toks, g.unit)
    E = compute_present_in_chain(expected, chain, g.unit, len(g.groups), g.parallel.dcp)
    h = compute_lookup(rg, E, len(toks), lookahead=lam).hit_length
    tails = compute_tail_boundaries(rg, E, len(toks), h, rs.tail_key, lam)
    return chain, E, h, tails, plan_load(rg, E, h, tails)
