"""A deterministic synthetic model whose KV makes wrong loads visible.

* attention KV at position p: a function of the whole prefix [0, p];
* EAGLE/draft (an EAGLE-flagged attention group) KV at p: a function of [0, p + 1] — the next
  token, which for the prompt's last position is the *sampled* token (a value no prompt has),
  the reason EAGLE rewinds one unit;
* Mamba state after t tokens: a function of [0, t).

Values are float32 with 24-bit integer mantissas (exact), derived by splitmix64 from a rolling
64-bit prefix hash, so equal prefixes give bit-equal KV and different prefixes differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

MASK = (1 << 64) - 1
SAMPLED = -7  # the token EAGLE's draft sees after the prompt's last position (never a prompt token)


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def compute_prefix_hashes(tokens: Sequence[int], seed: int = 0) -> np.ndarray:
    """Return pre[t] for t = 0..len(tokens): a 64-bit hash of tokens[:t]."""
    out = np.empty(len(tokens) + 1, dtype=np.uint64)
    h = _mix(seed)
    out[0] = h
    for k, tok in enumerate(tokens):
        h = _mix(h ^ ((int(tok) * 0x100000001B3) & MASK))
        out[k + 1] = h
    return out


def _values(hashes: np.ndarray, salt: int, width: int) -> np.ndarray:
    """Return float32 [len(hashes), width]: splitmix64 of (hash, salt, lane), top 24 bits."""
    with np.errstate(over="ignore"):
        lanes = np.arange(width, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x = hashes[:, None] ^ np.uint64(salt * 0xD1B54A32D192ED03 & MASK) ^ lanes[None, :]
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    out: np.ndarray = (x >> np.uint64(40)).astype(np.float32)
    return out


class SyntheticModel:
    """Computes the KV of every group for a request ('prefill')."""

    def __init__(self, width: int = 8, seed: int = 0) -> None:
        self.width = width
        self.seed = seed

    def attention_kv(self, tokens: Sequence[int], group: int, draft: bool, sampled: int = -1) -> torch.Tensor:
        """Return float32 [len(tokens), width]: the KV of every position of a request for one attention group (the
        draft KV of the last position sees `sampled`, the token that followed: SAMPLED unless the request's output
        is known)."""
        pre = compute_prefix_hashes(tokens, self.seed)
        if not draft:
            return torch.from_numpy(_values(pre[1:], group + 1, self.width))
        nxt = compute_prefix_hashes([*tokens, SAMPLED if sampled < 0 else sampled], self.seed)  # [0, p+1]
        return torch.from_numpy(_values(nxt[2:], group + 1, self.width))

    def mamba_states(self, tokens: Sequence[int], group: int, ts: Sequence[int]) -> torch.Tensor:
        """Return float32 [len(ts), width]: the recurrent states after the first t tokens, for each t."""
        pre = compute_prefix_hashes(tokens, self.seed)
        return torch.from_numpy(_values(pre[np.asarray(ts, dtype=np.int64)], 1000 + group, self.width))

    def mamba_state(self, tokens: Sequence[int], group: int, t: int) -> torch.Tensor:
        """Return float32 [width]: the recurrent state after the first t tokens."""
        pre = compute_prefix_hashes(tokens[:t], self.seed)
        return torch.from_numpy(_values(pre[-1:], 1000 + group, self.width))[0]
