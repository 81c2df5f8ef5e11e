"""A tiny real hybrid model (issue 31): Mamba2-style recurrent layers, an MLA-style attention layer computed
with decode context parallelism, an EAGLE draft layer, greedy decoding with EAGLE propose/verify.

Deterministic seeded fp32 weights (≈100k parameters), no training: what matters is that every number the
caches hold is one the model computes and consumes, so a wrong load changes the logits.

* Embedding E [V, d]; an lm_head [d, V] shared by the target and the draft.
* One Mamba layer per Mamba KV group (in group order): in-projection to (x, z, B, C, dt), a width-4 causal
  convolution over x, a sequential selective scan h ← exp(dt·A)·h + dt·x⊗B, y = h·C + D·x, gated by
  silu(z), out-projection, residual. The state after exactly t tokens is (the last 3 conv inputs, the scan
  state), flattened: what a Mamba group's object holds.
* One attention layer (MLA-like): each token's latent c = h·W_dkv (width r) is what the attention group
  caches; keys and values are up-projected from latents. Under DCP (`AttentionComm`) each rank holds the
  latents of the positions it owns; a chunk's queries attend over each rank's shard separately, giving
  (o_r, lse_r); the ranks all-gather them, and every rank merges the shards and the chunk's own causal
  part by o = Σ exp(lse_i − lse)·o_i, lse = logsumexp_i lse_i, in a fixed order (an empty shard weighs 0).
  vLLM reduce-scatters the merged output over heads; here every rank merges all heads (same values).
* EAGLE draft: g = [E(token_{p+1}); h_p]·W_fc (W_fc = [I; 0.3·R]: the next token's embedding plus a little
  of h_p, a guess of the target's next hidden state), one attention layer with its own latents (the draft
  group's objects), then the shared lm_head proposes token p + 2.

Bitwise equality of a warm and a cold run holds when both compute in the same chunks (every chunk a unit
[k·u, (k+1)·u), the hit a multiple of u), on one thread: ModelRunner (impl/model_rank.py) does that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs
import torch

VOCAB, D_MODEL, LATENT, HEADS, HEAD_DIM = 256, 32, 16, 2, 16
D_INNER, M_HEADS, D_STATE, CONV = 32, 2, 8, 4
STATE_WIDTH = (CONV - 1) * D_INNER + D_INNER * D_STATE  # conv inputs + the scan state of every head
NEG_INF = float("-inf")

# (this rank's partial output [n, H, hd], its lse [n, H]) -> every rank's pair, in rank order
Gather = Callable[[torch.Tensor, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]


def gather_alone(o: torch.Tensor, lse: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Return [(o, lse)]: the all-gather of one rank (no DCP)."""
    return [(o, lse)]


def _weights(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) / math.sqrt(shape[0])


@attrs.define
class MambaWeights:
    """One Mamba layer's weights."""

    w_in: torch.Tensor  # [d, 2·d_inner + 2·N + heads]
    conv: torch.Tensor  # [d_inner, CONV]
    a_log: torch.Tensor  # [heads]
    dt_bias: torch.Tensor  # [heads]
    d_skip: torch.Tensor  # [d_inner]
    w_out: torch.Tensor  # [d_inner, d]


@attrs.define
class AttentionWeights:
    """One MLA-like attention layer's weights."""

    w_q: torch.Tensor  # [d, H·hd]
    w_dkv: torch.Tensor  # [d, r]: the latent each position caches
    w_uk: torch.Tensor  # [r, H·hd]
    w_uv: torch.Tensor  # [r, H·hd]
    w_o: torch.Tensor  # [H·hd, d]


def _attention_weights(gen: torch.Generator) -> AttentionWeights:
    return AttentionWeights(w_q=_weights(gen, D_MODEL, HEADS * HEAD_DIM), w_dkv=_weights(gen, D_MODEL, LATENT),
                            w_uk=_weights(gen, LATENT, HEADS * HEAD_DIM), w_uv=_weights(gen, LATENT, HEADS * HEAD_DIM),
                            w_o=0.3 * _weights(gen, HEADS * HEAD_DIM, D_MODEL))  # layers nudge the residual


def merge_partials(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Return Σ exp(lse_i − lse)·o_i with lse = logsumexp_i lse_i, summed in the order given (an empty part, lse −∞,
    weighs 0)."""
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    out = torch.zeros_like(parts[0][0])
    for o, l_i in parts:
        out = out + torch.exp(l_i - lse).unsqueeze(-1) * o
    return out


def attend_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (o, lse) of queries q [n, H, hd] over keys/values [m, H, hd] (causal: query i sees keys 0..i)."""
    n = q.shape[0]
    if k.shape[0] == 0:
        return torch.zeros_like(q), torch.full((n, HEADS), NEG_INF, device=q.device)
    s = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(HEAD_DIM)
    if causal:
        s = s.masked_fill(torch.ones(n, k.shape[0], dtype=torch.bool, device=q.device).triu(1), NEG_INF)
    lse = torch.logsumexp(s, dim=-1)  # [H, n]
    o = torch.einsum("hnm,mhd->nhd", torch.exp(s - lse.unsqueeze(-1)), v)
    return o, lse.transpose(0, 1)


class TinyHybrid:
    """The model's weights and its layers as pure functions of (inputs, caches)."""

    def __init__(self, mamba_layers: int = 1, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(VOCAB, D_MODEL, generator=gen)
        self.mamba = [MambaWeights(w_in=_weights(gen, D_MODEL, 2 * D_INNER + 2 * D_STATE + M_HEADS),
                                   conv=torch.randn(D_INNER, CONV, generator=gen) / 2,
                                   a_log=torch.rand(M_HEADS, generator=gen), dt_bias=torch.randn(M_HEADS, generator=gen),
                                   d_skip=torch.randn(D_INNER, generator=gen),
                                   w_out=0.3 * _weights(gen, D_INNER, D_MODEL))
                      for _ in range(mamba_layers)]
        self.attention = _attention_weights(gen)
        self.lm_head = _weights(gen, D_MODEL, VOCAB)
        # the draft guesses the next hidden state as the next token's embedding plus a little of this one's
        self.w_fc = torch.cat([torch.eye(D_MODEL), 0.3 * _weights(gen, D_MODEL, D_MODEL)])
        self.draft = _attention_weights(gen)

    def to(self, device: torch.device) -> TinyHybrid:
        """Return the model with every weight on `device` (in place)."""
        self.embed, self.lm_head, self.w_fc = (t.to(device) for t in (self.embed, self.lm_head, self.w_fc))
        layers: list[MambaWeights | AttentionWeights] = [*self.mamba, self.attention, self.draft]
        for w in layers:
            for name in attrs.fields_dict(type(w)):
                setattr(w, name, getattr(w, name).to(device))
        return self

    def initial_state(self) -> torch.Tensor:
        """Return the Mamba state before any token."""
        return torch.zeros(STATE_WIDTH, device=self.embed.device)

    def mamba_chunk(self, layer: int, h: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (h + the layer's output [n, d], the state after each token [n, STATE_WIDTH]) from `state`."""
        w = self.mamba[layer]
        proj = h @ w.w_in
        x, z = proj[:, :D_INNER], proj[:, D_INNER:2 * D_INNER]
        bmat, cmat = proj[:, 2 * D_INNER:2 * D_INNER + D_STATE], proj[:, 2 * D_INNER + D_STATE:2 * D_INNER + 2 * D_STATE]
        dt = torch.nn.functional.softplus(proj[:, 2 * D_INNER + 2 * D_STATE:] + w.dt_bias)  # [n, heads]
        a = -torch.exp(w.a_log)
        conv = state[:(CONV - 1) * D_INNER].view(CONV - 1, D_INNER)
        ssm = state[(CONV - 1) * D_INNER:].view(M_HEADS, D_INNER // M_HEADS, D_STATE)
        ys, states = [], []
        for i in range(h.shape[0]):  # the sequential scan: one token at a time, in order
            window = torch.cat([conv, x[i:i + 1]])  # [CONV, d_inner]
            xc = torch.nn.functional.silu((window.transpose(0, 1) * w.conv).sum(dim=1))
            xh = xc.view(M_HEADS, D_INNER // M_HEADS)
            decay = torch.exp(dt[i] * a).view(M_HEADS, 1, 1)
            ssm = decay * ssm + (dt[i].view(M_HEADS, 1, 1) * xh.unsqueeze(-1)) * bmat[i].view(1, 1, D_STATE)
            y = (ssm * cmat[i].view(1, 1, D_STATE)).sum(-1).reshape(D_INNER) + w.d_skip * xc
            ys.append(y * torch.nn.functional.silu(z[i]))
            conv = window[1:]
            states.append(torch.cat([conv.reshape(-1), ssm.reshape(-1)]))
        return h + torch.stack(ys) @ w.w_out, torch.stack(states)

    @staticmethod
    def latents(w: AttentionWeights, h: torch.Tensor) -> torch.Tensor:
        """Return the latents [n, r] the attention group caches for hidden states h [n, d]."""
        return h @ w.w_dkv

    @staticmethod
    def attend(w: AttentionWeights, h: torch.Tensor, new_latents: torch.Tensor, shard: torch.Tensor,
               gather: Gather) -> torch.Tensor:
        """Return h + attention([n, d]) of a chunk: DCP over every rank's `shard` of the cached context (this rank's
        latents [m, r]) merged with the chunk's causal part."""
        n = h.shape[0]
        q = (h @ w.w_q).view(n, HEADS, HEAD_DIM)

        def kv(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            m = c.shape[0]
            return (c @ w.w_uk).view(m, HEADS, HEAD_DIM), (c @ w.w_uv).view(m, HEADS, HEAD_DIM)

        parts = gather(*attend_partial(q, *kv(shard), causal=False))
        parts.append(attend_partial(q, *kv(new_latents), causal=True))
        return h + merge_partials(parts).reshape(n, HEADS * HEAD_DIM) @ w.w_o

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Return the lm_head's logits [n, V] (the target's and the draft's)."""
        return h @ self.lm_head

    def draft_input(self, next_tokens: Sequence[int], h: torch.Tensor) -> torch.Tensor:
        """Return the EAGLE draft layer's input [E(token_{p+1}); h_p]·W_fc [n, d]."""
        ids = torch.tensor(list(next_tokens), dtype=torch.long, device=h.device)
        return torch.cat([self.embed[ids], h], dim=1) @ self.w_fc
