"""Failure closure: what a load that partly failed leaves valid, and how retries are bounded.

A load result is one bool per planned block (every rank's key of that block loaded). The safe
boundary is the largest boundary b <= h at which every group has everything it needs:
attention groups the blocks covering [0, b) loaded; Mamba groups a state at exactly b — the
loaded state when b = h, otherwise a state stored at b that a retry can load — or b = 0.
Everything at or beyond b is invalidated in every group. A request whose load failed is never
offered the same failing hit again: its next lookup is capped at the safe boundary, and after
`max_retries` failed loads it recomputes from 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .geometry import Geometry, compute_alignment, compute_group_ids
from .lookup import ObjSet, compute_group_present
from .plan import LoadEntry
from .types import GroupId, Tokens

DEFAULT_MAX_RETRIES = 2


def compute_loaded_prefix(geometry: Geometry, group: GroupId, hit: Tokens, plan: Sequence[LoadEntry],
                          ok: Sequence[bool]) -> Tokens:
    """Return how far [0, ·) of an attention group is loaded: the end of its leading run of loaded blocks."""
    end = 0
    for e, good in zip(plan, ok):
        if e.group != group:
            continue
        if not good or e.start != end:
            break
        end = e.end
    return Tokens(min(end, hit))


def compute_safe_boundary(geometry: Geometry, present: ObjSet, hit: Tokens, plan: Sequence[LoadEntry],
                          ok: Sequence[bool]) -> Tokens:
    """Return the largest b <= h with every attention prefix [0, b) loaded and every Mamba state at b usable."""
    if hit <= 0:
        return Tokens(0)
    a = compute_alignment(geometry)
    attn = compute_group_ids(geometry, "attention")
    mamba = compute_group_ids(geometry, "mamba")
    cap = min((compute_loaded_prefix(geometry, g, hit, plan, ok) for g in attn), default=hit)
    if not mamba:
        return Tokens(cap // a * a)
    mamba_loaded = all(good for e, good in zip(plan, ok) if e.group in mamba)
    if cap >= hit and mamba_loaded:
        return hit
    # fall back to a lower boundary where every Mamba group has a stored state (a retry loads it)
    lower = [t for t in compute_group_present(present, mamba) if t < hit and t <= cap and t % a == 0]
    return Tokens(max(lower, default=0))


def is_block_kept(entry: LoadEntry, safe: Tokens) -> bool:
    """Return whether a loaded block stays valid after the closure: it must end at or below the safe boundary."""
    return entry.end <= safe


def compute_retry_cap(failed_loads: int, safe: Tokens, max_retries: int = DEFAULT_MAX_RETRIES) -> Tokens | None:
    """Return the hit cap of the next lookup after `failed_loads` failures: the safe boundary, 0 past the retry budget."""
    if failed_loads <= 0:
        return None
    return Tokens(0) if failed_loads > max_retries else safe


@attrs.frozen(kw_only=True)
class Breaker:
    """vLLM 0.34.0's lookup deadline and circuit breaker (Mooncake store lookup client): a lookup unanswered within
    `deadline_s` counts as a failure and answers hit 0; after `threshold` consecutive failures new lookups are skipped
    (hit 0, nothing asked) for `cooldown_s`; then one probe runs and the others are held for `deadline_s`."""

    deadline_s: float = 1.0  # kv_connector_extra_config lookup_timeout_s
    threshold: int = 3  # LOOKUP_BREAKER_FAILURE_THRESHOLD
    cooldown_s: float = 30.0  # LOOKUP_BREAKER_COOLDOWN_S


@attrs.frozen(kw_only=True)
class LookupCall:
    """One lookup: when it starts, how long the store takes to answer it, and whether the answer is an error."""

    start_s: float
    answer_s: float  # seconds until the store answers (past the deadline: a timeout)
    error: bool = False


def compute_lookup_hits(calls: Sequence[LookupCall], hit: Sequence[int], breaker: Breaker = Breaker()) -> tuple[int, ...]:
    """Return each lookup's hit: its own (`hit`) when the breaker lets it run and the store answers without error
    within the deadline, else 0 — a hit of 0 loads nothing, so the failure closure has nothing to undo. The breaker:
    consecutive failures f, open until o; a lookup at t is skipped while t < o; one that runs with f >= threshold
    holds the others until t + deadline (it is the probe); an answer resets f and o; a failure (a timeout at
    t + deadline, or an error) adds one to f and, at the threshold, opens the breaker until then + cooldown."""
    failures, open_until, out = 0, 0.0, []
    for call, own in zip(calls, hit, strict=True):
        t = call.start_s
        if t < open_until:
            out.append(0)
            continue
        if failures >= breaker.threshold:
            open_until = t + breaker.deadline_s
        if call.answer_s <= breaker.deadline_s and not call.error:
            failures, open_until = 0, 0.0
            out.append(own)
            continue
        failures += 1
        if failures >= breaker.threshold:
            open_until = t + min(call.answer_s, breaker.deadline_s) + breaker.cooldown_s
        out.append(0)
    return tuple(out)
