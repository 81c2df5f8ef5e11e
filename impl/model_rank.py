"""One DCP rank running the tiny real model (impl/tiny_model.py) over impl/'s paged caches (issue 31).

The model's caches are the implementation's objects: the target layer's latents live in the target attention
group's blocks (this rank's slots only), the EAGLE draft layer's latents in the EAGLE-flagged group's blocks
(the same group when the draft shares the target's spec: then a row is [target latent | draft latent]), each
Mamba layer's state after t tokens in its Mamba group's block t/b − 1 (block ends) or copy-on-write block (the
checkpoint). RankEngine stores, looks up and loads them like any other bytes.

Every run computes in unit chunks [k·u, (k+1)·u) (the hit is a multiple of u), one thread, fp32: so a warm run
that loaded [0, h) and computes [h, N) does exactly the arithmetic a cold run does there, and equal caches give
bitwise-equal logits. The draft layer of a chunk runs once the token after the chunk is known (the next prompt
token, or the sampled one).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import torch

from .engine import RankEngine, RequestKV
from .tiny_model import LATENT, STATE_WIDTH, Gather, TinyHybrid


@attrs.frozen(kw_only=True)
class RunResult:
    """What one run of a request computed: its logits from `start` on, the generated tokens, speculation counts."""

    start: int  # the first position computed (0: cold; the hit or the safe boundary: warm)
    prefill_logits: torch.Tensor  # [N − start, V]: the target's logits at positions start..N−1
    decode_logits: torch.Tensor  # [steps, V]: the target's logits at every verified decode position
    tokens: tuple[int, ...]  # the generated tokens
    proposed: int  # draft proposals
    accepted: int  # proposals the target verified
    seconds: float  # compute alone


class ModelRunner:
    """The model on one rank: prefill a request (cold or after a load) and decode it, writing its caches into a
    RequestKV laid out as the engine's geometry says."""

    def __init__(self, model: TinyHybrid, engine: RankEngine, gather: Gather) -> None:
        self.model, self.eng, self.g, self.gather = model, engine, engine.g, gather
        groups = self.g.groups
        attn = [i for i, gr in enumerate(groups) if gr.kind == "attention"]
        flagged = [i for i in attn if groups[i].eagle]
        plain = [i for i in attn if not groups[i].eagle]
        self.target = plain[0] if plain else attn[0]
        self.draft = flagged[0] if flagged else None  # the EAGLE draft layer's group (None: no drafter)
        self.mambas = [i for i, gr in enumerate(groups) if gr.kind == "mamba"]
        self.unit = self.g.unit

    def new_cache(self, n_tokens: int) -> RequestKV:
        """Return an empty cache for n tokens (rows [target latent | draft latent], Mamba rows of STATE_WIDTH)."""
        return RequestKV(self.g, n_tokens, 2 * LATENT, self.eng.device, mamba_width=STATE_WIDTH)

    # ---------------------------------------------------------------- cache layout
    def _owned(self, group: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pos, blk, slot = self.eng.owned_rows(hi, group)
        keep = pos >= lo
        return pos[keep], blk[keep], slot[keep]

    def _write_latents(self, group: int, col: int, lo: int, latents: torch.Tensor, kv: RequestKV) -> None:
        pos, blk, slot = self._owned(group, lo, lo + latents.shape[0])
        dev = self.eng.device
        kv.tensors[group][blk.to(dev), slot.to(dev), col:col + LATENT] = latents[(pos - lo).to(dev)]

    def _shard(self, group: int, col: int, lo: int, kv: RequestKV) -> torch.Tensor:
        pos, blk, slot = self._owned(group, 0, lo)
        return kv.tensors[group][blk.to(self.eng.device), slot.to(self.eng.device), col:col + LATENT]

    def _write_states(self, layer: int, lo: int, states: torch.Tensor, keep: int, kv: RequestKV) -> None:
        """Put the states after tokens lo+1 .. lo+n where the store rule keys them: block ends, and `keep`."""
        gi = self.mambas[layer]
        b = self.g.groups[gi].block_size
        for k in range(states.shape[0]):
            t = lo + k + 1
            if t % b == 0:
                kv.tensors[gi][t // b - 1] = states[k]
            elif t == keep:
                kv.tensors[gi][kv.cow_block(gi)] = states[k]

    def differing_rows(self, warm: RequestKV, cold: RequestKV, start: int) -> dict[str, list[int]]:
        """Return, per layer ('target', 'draft'), this rank's positions below `start` whose loaded latent differs
        (bitwise) from the one a cold run computed."""
        out: dict[str, list[int]] = {}
        layers = [("target", self.target, 0)] + ([("draft", self.draft, LATENT)] if self.draft is not None else [])
        for name, group, col in layers:
            pos, blk, slot = self._owned(group, 0, start)
            at = (blk.to(self.eng.device), slot.to(self.eng.device))
            a = warm.tensors[group][at[0], at[1], col:col + LATENT].contiguous()
            b = cold.tensors[group][at[0], at[1], col:col + LATENT].contiguous()
            bad = (a.view(torch.int32) != b.view(torch.int32)).any(dim=1).cpu()
            out[name] = [int(p) for p in pos[bad].tolist()]
        return out

    def loaded_state(self, kv: RequestKV, layer: int, hit: int) -> torch.Tensor:
        """Return a Mamba layer's state at the hit from a loaded cache (the block the load put it in)."""
        gi = self.mambas[layer]
        b = self.g.groups[gi].block_size
        return kv.tensors[gi][(hit + b - 1) // b - 1].clone()

    # ---------------------------------------------------------------- compute
    def _target(self, tokens: Sequence[int], lo: int, hi: int, states: list[torch.Tensor], kv: RequestKV,
                keep: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Run the target on tokens[lo:hi]; return (hidden [n, d], logits, each layer's states per token)."""
        h = self.model.embed[torch.tensor(list(tokens[lo:hi]), dtype=torch.long, device=self.eng.device)]
        per_token = []
        for layer in range(len(self.mambas)):
            h, st = self.model.mamba_chunk(layer, h, states[layer])
            self._write_states(layer, lo, st, keep, kv)
            per_token.append(st)
        att = self.model.attention
        new = self.model.latents(att, h)
        shard = self._shard(self.target, 0, lo, kv)
        self._write_latents(self.target, 0, lo, new, kv)
        h = self.model.attend(att, h, new, shard, self.gather)
        return h, self.model.logits(h), per_token

    def _draft(self, lo: int, next_tokens: Sequence[int], h: torch.Tensor, kv: RequestKV) -> torch.Tensor:
        """Run the draft layer on positions lo.. (their next tokens known); return its logits (proposals)."""
        assert self.draft is not None
        w = self.model.draft
        x = self.model.draft_input(next_tokens, h)
        new = self.model.latents(w, x)
        shard = self._shard(self.draft, LATENT, lo, kv)
        self._write_latents(self.draft, LATENT, lo, new, kv)
        return self.model.logits(self.model.attend(w, x, new, shard, self.gather))

    def run(self, tokens: Sequence[int], kv: RequestKV, decode: int, start: int = 0,
            states: list[torch.Tensor] | None = None, keep: int = 0) -> RunResult:
        """Prefill tokens[start:] in unit chunks over a cache holding [0, start) (and each Mamba layer's state at
        start), then generate `decode` tokens greedily (EAGLE propose/verify when there is a drafter); `keep` is the
        one Mamba position off the block grid whose state is kept for the store (the checkpoint)."""
        t0 = time.perf_counter()
        n, u = len(tokens), self.unit
        states = list(states) if states is not None else [self.model.initial_state() for _ in self.mambas]
        logits, pending = [], None  # pending: (first position, hidden rows) whose draft waits for a next token
        for lo in range(start, n, u):
            hi = min(lo + u, n)
            h, lg, st = self._target(tokens, lo, hi, states, kv, keep)
            states = [s[-1] for s in st]
            logits.append(lg)
            if self.draft is not None:
                if hi < n:
                    self._draft(lo, tokens[lo + 1:hi + 1], h, kv)
                else:
                    pending = (lo, h)
        prefill = torch.cat(logits) if logits else torch.zeros(0, self.model.lm_head.shape[1], device=self.eng.device)
        last = prefill[-1]
        seq, out, verified = list(tokens), list[int](), list[torch.Tensor]()
        proposed = accepted = 0
        while len(out) < decode:
            x = int(torch.argmax(last))
            if self.draft is None or len(out) + 1 == decode:
                pos = len(seq)
                seq.append(x)
                out.append(x)
                if pending is not None:  # the draft rows waiting for this token (the writer stores them)
                    self._draft(pending[0], seq[pending[0] + 1:pos + 1], pending[1], kv)
                    pending = None
                if len(out) == decode:
                    break
                h, lg, st = self._target(seq, pos, pos + 1, states, kv, keep)
                states = [s[-1] for s in st]
                last = lg[-1]
                verified.append(last)
                if self.draft is not None:
                    pending = (pos, h)
                continue
            assert pending is not None
            lo, hp = pending
            draft_logits = self._draft(lo, [*seq[lo + 1:], x], hp, kv)
            y = int(torch.argmax(draft_logits[-1]))
            pos = len(seq)
            h, lg, st = self._target([*seq, x, y], pos, pos + 2, states, kv, keep)
            proposed += 1
            seq.append(x)
            out.append(x)
            if int(torch.argmax(lg[0])) == y:
                accepted += 1
                seq.append(y)
                out.append(y)
                states, last, pending = [s[-1] for s in st], lg[1], (pos, h)
                verified.extend([lg[0], lg[1]])
            else:
                states, last, pending = [s[0] for s in st], lg[0], (pos, h[:1])
                verified.append(lg[0])
        dec = torch.stack(verified) if verified else torch.zeros(0, self.model.lm_head.shape[1], device=self.eng.device)
        return RunResult(start=start, prefill_logits=prefill, decode_logits=dec, tokens=tuple(out[:decode]),
                         proposed=proposed, accepted=accepted, seconds=time.perf_counter() - t0)

