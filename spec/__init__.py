"""kvspec executable spec: pure functions over frozen values (no torch, no I/O).

The public surface below is what porters and tests use; every name is documented where it is
defined (spec/README.md maps them to the rules).
"""

from .errors import SpecError
from .failure import compute_retry_cap, compute_safe_boundary
from .geometry import (
                       Geometry,
                       Group,
                       Parallel,
                       compute_alignment,
                       compute_lcm_span,
                       compute_span,
                       is_fine,
                       make_geometry,
                       resolve_kind,
)
from .keys import KEY_GRAMMARS, StoreKey, compute_hash_chain, render_key
from .limits import MAX_DCP, MAX_GROUPS, MAX_PROMPT, MAX_SHARDS
from .lookup import LookupResult, compute_lookup, compute_tail_boundaries
from .plan import LoadEntry, plan_load
from .presets import PRESETS, get_preset
from .rules import DEFAULT_RULES, RULE_SETS, RuleSet, get_rules
from .scenario import Outcome, Scenario, StoredRequest, decode_scenario, encode_error, encode_outcome, evaluate_scenario
from .store import compute_rule_store

__all__ = [
    "DEFAULT_RULES", "KEY_GRAMMARS", "MAX_DCP", "MAX_GROUPS", "MAX_PROMPT", "MAX_SHARDS", "PRESETS", "RULE_SETS",
    "Geometry", "Group", "LoadEntry", "LookupResult", "Outcome", "Parallel", "RuleSet", "Scenario", "SpecError",
    "StoreKey", "StoredRequest", "compute_alignment", "compute_hash_chain", "compute_lcm_span", "compute_lookup",
    "compute_retry_cap", "compute_rule_store", "compute_safe_boundary", "compute_span", "compute_tail_boundaries",
    "decode_scenario", "encode_error", "encode_outcome", "evaluate_scenario", "get_preset", "get_rules", "is_fine",
    "make_geometry", "plan_load", "render_key", "resolve_kind",
]
