"""The spec's documented input limits: every scenario it accepts is answered in well under 2 s.

The spec lists its objects explicitly (store sets, present sets, load plans), so its cost grows
with the number of rank shards a scenario names.  Rather than let a 10^30-token prompt or a
DCP size of 10^12 run out of memory or hang, construction refuses values past these limits
with a SpecError naming the rule.  Each limit is far above any deployed engine.
"""

from __future__ import annotations

import functools
import math

from .errors import SpecError

MAX_DCP = 4096  # DCP ranks (a rank list is enumerated)
MAX_PCP = 4096
MAX_GROUPS = 64  # KV-cache groups (real hybrids have 2-4)
MAX_BLOCK = 1 << 24  # tokens per block per rank
MAX_PROMPT = 1 << 40  # tokens in one request
MAX_STORED = 64  # stored requests in one scenario
MAX_SHARDS = 1 << 15  # rank shards the explicit spec lists: D * (groups' blocks over the longest prompt + objects);
#                       past it a scenario of stored requests is answered on runs and points (spec/boundaries.py)
MAX_EVICTED = 1 << 15  # evicted shards one scenario lists
MAX_CHUNK_ENDS = 1 << 15  # chunk ends the stored prefills' derived schedules name in all (≈9 µs of CPU each)

RULE_LIMIT_DCP = "limit-dcp"
RULE_LIMIT_PCP = "limit-pcp"
RULE_LIMIT_GROUPS = "limit-groups"
RULE_LIMIT_BLOCK = "limit-block"
RULE_LIMIT_PROMPT = "limit-prompt"
RULE_LIMIT_STORED = "limit-stored"
RULE_LIMIT_SHARDS = "limit-shards"
RULE_LIMIT_EVICTED = "limit-evicted"
RULE_LIMIT_CHUNKS = "limit-chunks"


def check_count(value: int, limit: int, rule: str, what: str) -> None:
    """Raise SpecError(rule) unless value <= limit."""
    if value > limit:
        raise SpecError(rule, f"{what} {value} exceeds the limit {limit} (spec/limits.py)")


@functools.lru_cache(maxsize=4096)  # every scenario's validation asks it; a scope asks few distinct ones
def compute_shard_bound(dcp: int, spans: tuple[int, ...], longest: int, requests: int, objects: int) -> int:
    """Return D * (requests * sum_g (ceil(longest / s_g) + 2) + objects), the shards a scenario can name."""
    return dcp * (max(requests, 1) * sum(math.ceil(longest / s) + 2 for s in spans) + objects)


def compute_longest_prompt(dcp: int, spans: tuple[int, ...], requests: int, objects: int) -> int:
    """Return the largest P <= MAX_PROMPT with compute_shard_bound(dcp, spans, P, requests, objects) <= MAX_SHARDS."""
    lo, hi = -1, MAX_PROMPT
    while lo < hi:  # the bound is monotone in P; -1 when even P = 0 is past the limit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if compute_shard_bound(dcp, spans, max(mid, 0), requests, objects) <= MAX_SHARDS else (lo, mid - 1)
    return lo
