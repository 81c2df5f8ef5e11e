"""Domain aliases: every integer in the spec says what it counts."""

from __future__ import annotations

from typing import NewType

Tokens = NewType("Tokens", int)  # a count of logical tokens
Boundary = NewType("Boundary", int)  # a token boundary t (a multiple of the unit), keys H_t
BlockIdx = NewType("BlockIdx", int)  # block index i of a group: tokens [i*s, (i+1)*s)
Rank = NewType("Rank", int)  # a DCP rank
GroupId = NewType("GroupId", int)  # connector group id (order of --group flags)

KINDS: tuple[str, ...] = ("attention", "mamba")
# other engines' names for the two kinds (input only; the spec and its output use KINDS)
KIND_ALIASES: dict[str, str] = {"mla": "attention", "full_attention": "attention", "gdn": "mamba", "kda": "mamba",
                                "linear": "mamba", "linear_attention": "mamba"}
RETENTIONS: tuple[str, ...] = ("replay", "dense")
