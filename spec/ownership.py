"""DCP ownership: which rank holds a token of an attention block, and in which local slot."""

from __future__ import annotations

from .types import Rank, Tokens


def compute_owner(position: Tokens, span: Tokens, dcp: int, interleave: int) -> tuple[Rank, int]:
    """Return (rank, slot) of token position p in its block: o = p mod s, runs of I tokens round-robin."""
    o = position % span
    rank = (o // interleave) % dcp
    slot = (o // (dcp * interleave)) * interleave + (o % interleave)
    return Rank(rank), slot


def compute_rank_positions(block: int, span: Tokens, dcp: int, interleave: int, rank: Rank) -> tuple[int, ...]:
    """Return the token positions of block i held by rank r, in slot order."""
    owned = [(compute_owner(Tokens(p), span, dcp, interleave), p) for p in range(block * span, (block + 1) * span)]
    return tuple(p for (r, _slot), p in sorted(owned, key=lambda x: x[0][1]) if r == rank)
