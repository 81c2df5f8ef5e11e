"""The reference store: a write-once map of rank shards with eviction (the in-memory fake of spec tests).

Transitions return new values (attrs.evolve); nothing is mutated.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .store import RankObj


@attrs.frozen(kw_only=True)
class ModelStore:
    """Present rank shards: (group, boundary, rank) in one namespace (one hash chain per object)."""

    shards: frozenset[tuple[bytes, int, int]] = frozenset()  # (hash H_t, group, rank)

    def has(self, h: bytes, group: int, rank: int) -> bool:
        """Return whether one rank's shard of (group, H_t) exists."""
        return (h, group, rank) in self.shards


def apply_put(store: ModelStore, shards: Iterable[tuple[bytes, int, int]]) -> ModelStore:
    """Return the store after puts (a put of an existing shard keeps the first: set union)."""
    return attrs.evolve(store, shards=store.shards | frozenset(shards))


def apply_evict(store: ModelStore, shards: Iterable[tuple[bytes, int, int]]) -> ModelStore:
    """Return the store after evicting shards (absent ones are ignored)."""
    return attrs.evolve(store, shards=store.shards - frozenset(shards))


def compute_present_in_chain(store: ModelStore, chain: tuple[bytes, ...], unit: int, groups: int,
                             ranks: int) -> frozenset[tuple[int, int]]:
    """Return E for a request's chain: (group, t) whose shard exists on every rank."""
    return frozenset((g, (k + 1) * unit) for k, h in enumerate(chain) for g in range(groups)
                     if all((h, g, r) in store.shards for r in range(ranks)))


__all__ = ["ModelStore", "RankObj", "apply_evict", "apply_put", "compute_present_in_chain"]
