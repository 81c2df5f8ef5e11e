"""One DCP rank: paged KV memory, prefill, the store path, the lookup and the load path.

Shares with the spec only the frozen geometry types (and their derived quantities) and the
key grammar / hash chain; the store rule, the lookup, tail keys and the load plan are this
module's and ``impl/lookup.py``'s own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch

from kvspec.spec.geometry import (
    Geometry,
    RankFields,
    compute_alignment,
    compute_lcm_span,
    compute_rank_fields,
    compute_span,
    is_fine,
)
from kvspec.spec.keys import StoreKey, render_key
from kvspec.spec.types import Rank

from .device import needs_staging
from .job import STORE_PR53324, STORE_VLLM
from .lookup import HybridLookup
from .mooncake_store import NO_AVAILABLE_HANDLE, StoreClient
from .reports import LoadReport, LookupReport, StoreReport
from .synthetic import SyntheticModel

Obj = tuple[int, int]



# the implementation's store rules (the rank job's `store_rule`; the harness maps a rule set's store field to one)

class RequestKV:
    """Paged KV of one request on one rank: attention [blocks, b, W] (this rank's slots), Mamba [blocks+1, W].

    With staging (a store client that cannot address device memory, e.g. the non-CUDA Mooncake wheel with
    CUDA tensors), each slab has a host mirror (pinned when CUDA is present): the store reads and writes
    the mirror, and blocks are copied device -> host before a put and host -> device after a get.
    """

    def __init__(self, geometry: Geometry, n_tokens: int, width: int, device: torch.device,
                 staging: bool | None = None, mamba_width: int | None = None) -> None:
        self.tensors: list[torch.Tensor] = []
        for i, gr in enumerate(geometry.groups):
            blocks = max(1, math.ceil(max(n_tokens, 1) / compute_span(geometry, i)))
            shape = (blocks, gr.block_size, width) if gr.kind == "attention" else (blocks + 1, mamba_width or width)
            self.tensors.append(torch.full(shape, float("nan"), dtype=torch.float32, device=device))
        self.staging = needs_staging(device) if staging is None else staging
        pin = torch.cuda.is_available()
        self.host = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin) for t in self.tensors] \
            if self.staging else None

    @property
    def io_tensors(self) -> list[torch.Tensor]:
        """Return the slabs the store client reads and writes (the host mirrors when staging)."""
        return self.host if self.host is not None else self.tensors

    def block(self, group: int, index: int) -> torch.Tensor:
        """Return the physical block (a contiguous view) of a group."""
        return self.tensors[group][index]

    def io_block(self, group: int, index: int) -> torch.Tensor:
        """Return the block the store client puts from or gets into."""
        return self.io_tensors[group][index]

    def stage_out(self, blocks: Sequence[tuple[int, int]]) -> None:
        """Copy blocks device -> host mirror before a put (no-op without staging)."""
        if self.host is not None:
            for g, i in blocks:
                self.host[g][i].copy_(self.tensors[g][i], non_blocking=True)
        self.synchronize()

    def stage_in(self, blocks: Sequence[tuple[int, int]]) -> None:
        """Copy blocks host mirror -> device after a get (no-op without staging)."""
        if self.host is not None:
            for g, i in blocks:
                self.tensors[g][i].copy_(self.host[g][i], non_blocking=True)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for the device's copies and kernels on these tensors."""
        if self.tensors and self.tensors[0].device.type == "cuda":
            torch.cuda.synchronize(self.tensors[0].device)

    def cow_block(self, group: int) -> int:
        """Return the index of a Mamba group's copy-on-write block (the sub-block tail state)."""
        return self.tensors[group].shape[0] - 1


@contextlib.contextmanager
def registered(store: StoreClient, kv: RequestKV) -> Iterator[RequestKV]:
    """Register every slab of a request's KV with the store once, and unregister it after use."""
    ptrs = [t.data_ptr() for t in kv.io_tensors]
    for t in kv.io_tensors:
        store.register(t.data_ptr(), t.nbytes)
    try:
        yield kv
    finally:
        for p in ptrs:
            store.unregister(p)


def render_rank_key(geometry: Geometry, rank: int, group: int, boundary: int, chain: Sequence[bytes],
                    model: str = "kvspec-model", cache_prefix: str = "") -> str:
    """Return rank r's key of object (group, boundary) in a request's hash chain (H_t = chain[t/u − 1])."""
    return _render(compute_rank_fields(geometry, Rank(rank)), group, chain[boundary // geometry.unit - 1].hex(), model,
                   cache_prefix)


def _render(f: RankFields, group: int, hash_hex: str, model: str, cache_prefix: str) -> str:
    return render_key(StoreKey(model=model, tp_rank=f.tp_rank, pcp_rank=f.pcp_rank, dcp_rank=f.dcp_rank,
                               pp_rank=f.pp_rank, group=group, hash_hex=hash_hex, cache_prefix=cache_prefix))


class RankEngine:
    """The KV-cache connector of one DCP rank.

    Presence of an object means every rank's shard exists. A rank in a process group probes its own keys and
    MIN-all-reduces the bits (`all_reduce_min`); a rank without collectives (`probe_all_ranks`: the load
    harness) probes every rank's keys itself through its client.
    """

    def __init__(self, geometry: Geometry, rank: int, store: StoreClient | None, device: torch.device,
                 width: int = 8, model: str = "kvspec-model", cache_prefix: str = "",
                 all_reduce_min: Callable[[torch.Tensor], None] | None = None, store_rule: str = STORE_PR53324,
                 lookahead: int = 0, deferred_saves: bool = False, decode_states: bool = False,
                 probe_all_ranks: bool = False) -> None:
        if store_rule not in STORE_RULES:
            raise ValueError(f"unknown store rule {store_rule!r} (known: {', '.join(STORE_RULES)})")
        self.g = geometry
        self.store_rule = store_rule
        # hash lookahead λ (keys name [0, t + λ); kvspec's proposal for the connector path): the store rule takes no
        # EAGLE drop and stores only boundaries t with t + λ <= P; the synthetic draft KV is unchanged
        self.lookahead = lookahead
        self.drop = any(x.eagle for x in geometry.groups) and lookahead == 0
        # vLLM 0.34.0: boundaries whose hash waits for λ outputs are stored once the writer decoded them (plan_objects)
        self.deferred_saves = deferred_saves
        self.decode_states = decode_states  # with save_decode_cache: decode-phase Mamba states, replay kept every L
        self.rank = rank
        self.store = store
        self.device = device
        self.width = width
        self.model = SyntheticModel(width)
        self.model_name = model
        self.cache_prefix = cache_prefix
        self.fields = compute_rank_fields(geometry, Rank(rank))
        self.all_reduce_min = all_reduce_min or (lambda t: None)
        self.probe_all_ranks = probe_all_ranks
        self.spans = [compute_span(geometry, i) for i in range(len(geometry.groups))]

    # ---------------------------------------------------------------- keys
    def key(self, group: int, boundary: int, chain: Sequence[bytes]) -> str:
        """Return this rank's key of object (group, boundary) in a request's hash chain."""
        return _render(self.fields, group, chain[boundary // self.g.unit - 1].hex(), self.model_name, self.cache_prefix)

    # ---------------------------------------------------------------- prefill
    def owned_rows(self, n_tokens: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (positions, block index, slot) of this rank's tokens among the first n of an attention group."""
        s, d, il = self.spans[group], self.g.parallel.dcp, self.g.parallel.interleave
        pos = torch.arange(n_tokens)
        o = pos % s
        mine = ((o // il) % d) == self.rank
        pos = pos[mine]
        o = o[mine]
        return pos, pos // s, (o // (d * il)) * il + o % il

    def tail_boundary(self, n_prompt: int) -> int:
        """Return the sub-block tail T of a prompt: its last unit boundary, one unit lower under EAGLE."""
        u = self.g.unit
        return n_prompt // u * u - (u if self.drop else 0)

    def checkpoint(self, n_prompt: int) -> int:
        """Return vLLM 0.33.0's prompt checkpoint: the last a-boundary below the prompt, one a lower under EAGLE."""
        a = compute_alignment(self.g)
        if self.drop:
            return max(n_prompt // a * a - a, 0)
        return max((n_prompt - max(1, self.lookahead)) // a * a, 0)

    def sub_block_state(self, n_prompt: int) -> int:
        """Return the position of the one Mamba state this request keeps off the block grid (0: none)."""
        return self.checkpoint(n_prompt) if self.store_rule == STORE_VLLM else max(self.tail_boundary(n_prompt), 0)

    def prefill(self, tokens: Sequence[int], kv: RequestKV, sampled: int = -1, prompt: int | None = None) -> None:
        """Compute the KV of every position this rank owns, the Mamba state at every block end and at the prompt's
        tail T (`sampled`: the token after the last one, when known: the draft KV of the last position read it;
        `prompt`: the prompt's length when the tokens go on with its outputs, as a decode phase computes them)."""
        n = len(tokens)
        tail = self.sub_block_state(n if prompt is None else prompt)
        for i, gr in enumerate(self.g.groups):
            if gr.kind == "attention":
                values = self.model.attention_kv(tokens, i, draft=gr.eagle, sampled=sampled)
                pos, blk, slot = self.owned_rows(n, i)
                kv.tensors[i][blk.to(self.device), slot.to(self.device)] = values[pos].to(self.device)
                continue
            b = gr.block_size
            ends = list(range(b, n + 1, b))
            extra = [tail] if tail > 0 and tail % b else []
            states = self.model.mamba_states(tokens, i, ends + extra).to(self.device)
            if ends:
                kv.tensors[i][: len(ends)] = states[: len(ends)]
            if extra:  # the copy-on-write block holds the sub-block tail state
                kv.tensors[i][kv.cow_block(i)] = states[-1]

    # ---------------------------------------------------------------- store
    def plan_objects(self, n_prompt: int, chunk_ends: Sequence[int] | None = None, decoded: int = 0,
                     decode_saves: bool = False) -> list[Obj]:
        """Return the objects this request stores under the engine's store rule (only boundaries it can key).

        `chunk_ends`: where the scheduler ended this request's prefill steps (vLLM's rule: a Mamba state is written
        only where a step ends); None: a step ended at every Mamba block end and at the checkpoint. `decoded`: the
        outputs it generated before finishing; with deferred saves and λ > 0 they complete the hashes of the prompt's
        last boundaries: at finish the whole scheduler blocks of the prompt those hashes now name, and (dense
        retention) a Mamba state at a block end whose hash a later decode step saw. `decode_saves`: the connector
        saved the decode phase (vLLM's save_decode_cache): its whole scheduler blocks too, and with decode states
        its Mamba states, replay retention keeping one per scheduler block. A decode-phase object's bytes come from
        the KV the engine computed for the outputs (`prefill(…, prompt=)`)."""
        named = max(n_prompt - self.lookahead, 0) // self.g.unit * self.g.unit
        objs = [o for o in STORE_RULES[self.store_rule](self, n_prompt) if o[1] <= named]
        if (self.deferred_saves and self.lookahead and decoded) or decode_saves:
            if self.store_rule != STORE_VLLM:
                raise ValueError(f"deferred and decode-phase saves are vLLM's, not the {self.store_rule} store rule's")
            objs = sorted(set(objs) | set(self._deferred_vllm(n_prompt, decoded, decode_saves)))
        if chunk_ends is None:
            return objs
        if self.store_rule != STORE_VLLM:
            raise ValueError(f"the {self.store_rule} store rule assumes a step ended at every Mamba block end")
        ended = set(chunk_ends)  # the decode phase ends a step at every token
        return [(i, t) for i, t in objs if self.g.groups[i].kind == "attention" or t in ended or t > n_prompt]

    def _deferred_vllm(self, n_prompt: int, decoded: int, decode_saves: bool) -> list[Obj]:
        """Return what the outputs let a vLLM writer store past its prefill's save (see plan_objects)."""
        g, u, lcm = self.g, self.g.unit, compute_lcm_span(self.g)
        hashed_at_finish = max(n_prompt + decoded - self.lookahead, 0) // u * u
        reach = n_prompt + decoded - 1 if decode_saves else n_prompt
        whole = min(reach, hashed_at_finish) // lcm * lcm if decoded and (decode_saves or self.lookahead) else 0
        seen_by_a_step = n_prompt + decoded - 1 - self.lookahead
        hashed = max(n_prompt - self.lookahead, 0) // u * u
        out: list[Obj] = []
        for i, gr in enumerate(g.groups):
            if gr.kind == "attention":
                out += [(i, t) for t in range(self.spans[i], whole + 1, self.spans[i])]
                continue
            b = gr.block_size
            if g.retention == "dense":
                every = b
            elif decode_saves and self.decode_states:
                every = max(lcm // b, 1) * b  # one state per scheduler block; every block when L <= b
            else:
                continue
            # the prompt's states (where a step ended: plan_objects' chunk_ends filter) ...
            out += [(i, t) for t in range(every, max(hashed, min(n_prompt, seen_by_a_step)) + 1, every)]
            if decode_saves and self.decode_states:  # ... and the decode phase's: a step ends at every token
                out += [(i, t) for t in range(every, seen_by_a_step + 1, every) if t > n_prompt]
        return out

    def _objects_vllm(self, n_prompt: int) -> list[Obj]:
        """Return the objects of one prompt as vLLM 0.33.0's connector stores them (this implementation's reading).

        Attention: every whole scheduler block; in partial-hit mode also the blocks from the last whole
        scheduler block up to the checkpoint plus the EAGLE proof margin, each keyed at its end clipped
        there.  Mamba: the states retention keeps (dense: every block end; replay: the replay points)
        and the state at the checkpoint.
        """
        g, u = self.g, self.g.unit
        lcm, a = compute_lcm_span(g), compute_alignment(g)
        eagle = self.drop
        c = self.checkpoint(n_prompt)
        partial = is_fine(g) and a < lcm
        objs: set[Obj] = set()
        for i, gr in enumerate(g.groups):
            s = self.spans[i]
            if gr.kind == "attention":
                # whole scheduler blocks whose hashes exist (with λ: the last hash needs the λ tokens after it)
                hashed = max(n_prompt - self.lookahead, 0) // u * u
                objs.update((i, k) for k in range(s, min(n_prompt, hashed) // lcm * lcm + 1, s))
                spec_eagle = self.drop and any(x.eagle for x in g.groups
                                               if (x.kind, x.block_size) == ("attention", gr.block_size))
                margin = (u if s > u else s) if spec_eagle else 0
                end = c + margin
                if partial and c > 0 and end <= n_prompt:
                    objs.update((i, min((blk + 1) * s, end)) for blk in range(c // lcm * lcm // s, (end + s - 1) // s))
                continue
            b = gr.block_size
            if g.retention == "dense":
                objs.update((i, t) for t in range(b, n_prompt + 1, b))
            else:
                points = ([(n_prompt - 1) // lcm * lcm - lcm, n_prompt // lcm * lcm - lcm] if eagle
                          else [n_prompt - 1])
                objs.update((i, p // a * a // b * b) for p in points if p // a * a // b * b > 0)
            if c > 0:
                objs.add((i, c))
        return sorted(objs)

    def _objects_pr53324(self, n_prompt: int) -> list[Obj]:
        """Return the objects one prompt stores under PR #53324's rule (this implementation's reading)."""
        g = self.g
        full = n_prompt // compute_lcm_span(g) * compute_lcm_span(g)
        tail = self.tail_boundary(n_prompt)
        mamba_bs = [x.block_size for x in g.groups if x.kind == "mamba"]
        tail_on = is_fine(g) and tail > 0 and any(tail % b for b in mamba_bs)
        objs: set[Obj] = set()
        for i, gr in enumerate(g.groups):
            s = self.spans[i]
            if gr.kind == "attention":
                objs.update((i, k) for k in range(s, full + 1, s))
                if tail_on:
                    last = (tail + s - 1) // s - 1
                    objs.update((i, min((blk + 1) * s, tail)) for blk in range(min(full // s, last), last + 1))
            else:
                b = gr.block_size
                replay = (n_prompt - 1) // b * b if n_prompt > 0 else 0
                ckpts = range(b, replay + 1, b) if g.retention == "dense" else ([replay] if replay > 0 else [])
                objs.update((i, t) for t in ckpts)
                if tail_on and tail % b:
                    objs.add((i, tail))
        return sorted(objs)

    def object_block(self, kv: RequestKV, group: int, boundary: int) -> int:
        """Return the physical block index an object is put from: the attention block holding t - 1, or the
        Mamba checkpoint block (t a multiple of b) or copy-on-write block (the sub-block tail)."""
        if self.g.groups[group].kind == "attention":
            return (boundary + self.spans[group] - 1) // self.spans[group] - 1
        b = self.g.groups[group].block_size
        return boundary // b - 1 if boundary % b == 0 else kv.cow_block(group)

    def object_buffer(self, kv: RequestKV, group: int, boundary: int) -> torch.Tensor:
        """Return the block the store client puts an object from (its host mirror when staging)."""
        return kv.io_block(group, self.object_block(kv, group, boundary))

    def store_request(self, tokens: Sequence[int], chain: Sequence[bytes], kv: RequestKV,
                      chunk_ends: Sequence[int] | None = None, decoded: int = 0,
                      decode_saves: bool = False, reput: bool = False) -> StoreReport:
        """Put this rank's shard of every object of the request, zero-copy, skipping keys that exist (`tokens`: the
        prompt; `chunk_ends`, `decoded`, `decode_saves`: see plan_objects; the chain then also hashes the outputs;
        `reput`: a fault, FaultPlan.reput)."""
        assert self.store is not None
        objs = self.plan_objects(len(tokens), chunk_ends, decoded, decode_saves)
        keys, ptrs, sizes = [], [], []
        for i, t in objs:
            blk = self.object_buffer(kv, i, t)
            keys.append(self.key(i, t, chain))
            ptrs.append(blk.data_ptr())
            sizes.append(blk.numel() * blk.element_size())
        kv.stage_out([(i, self.object_block(kv, i, t)) for i, t in objs])  # and waits for the device
        # reput (FaultPlan.reput, tests only): skip the existence check, re-putting keys that exist (write-once keeps
        # the first value, so only the harness's redundant-put count can tell)
        exists = [0] * len(keys) if reput else self.store.exist(keys)
        todo = [k for k, e in enumerate(exists) if e != 1]
        rcs = self.store.put([keys[k] for k in todo], [ptrs[k] for k in todo], [sizes[k] for k in todo])
        return StoreReport(objects=tuple(objs), put=tuple(keys[k] for k, rc in zip(todo, rcs) if rc == 0),
                           existing=tuple(keys[k] for k, e in enumerate(exists) if e == 1),
                           store_full=sum(rc == NO_AVAILABLE_HANDLE for rc in rcs),
                           failed=tuple((keys[k], rc) for k, rc in zip(todo, rcs) if rc not in (0, NO_AVAILABLE_HANDLE)),
                           bytes=sum(sizes[k] for k, rc in zip(todo, rcs) if rc == 0))

    # ---------------------------------------------------------------- lookup
    def probe_everywhere(self, objs: Sequence[Obj], chain: Sequence[bytes]) -> set[Obj]:
        """Return the objects whose key exists on every rank: this rank's exist bits, MIN-all-reduced (collective), or
        every rank's keys probed here (probe_all_ranks)."""
        assert self.store is not None
        if self.probe_all_ranks:  # no collectives: this rank asks for every rank's shard
            d = self.g.parallel.dcp
            res = self.store.exist([render_rank_key(self.g, r, i, t, chain, self.model_name, self.cache_prefix)
                                    for i, t in objs for r in range(d)])
            return {o for k, o in enumerate(objs) if all(x == 1 for x in res[k * d:(k + 1) * d])}
        res = self.store.exist([self.key(i, t, chain) for i, t in objs])
        bits = torch.tensor([1 if r == 1 else 0 for r in res], dtype=torch.int32)
        self.all_reduce_min(bits)
        return {o for o, bit in zip(objs, bits.tolist()) if bit}

    def lookup(self, chain: Sequence[bytes], n_tokens: int, legacy: bool = False,
               cap: int | None = None) -> LookupReport:
        """Return the hit length and tail boundaries all ranks agree on (presence = MIN over ranks)."""
        own_probes = [0]

        def probe(objs: list[Obj]) -> set[Obj]:
            own_probes[0] += len(objs)
            return self.probe_everywhere(objs, chain)

        lk = HybridLookup(self.g, n_tokens, cap=cap, lookahead=self.lookahead)
        try:
            hit, tails = lk.run(probe, legacy=legacy)
        except LookupError as exc:  # the loud form of a -704: report, load nothing
            return LookupReport(hit=0, tails=(), rounds=lk.rounds, probes=own_probes[0], error=str(exc))
        return LookupReport(hit=hit, tails=tuple((int(g), int(t)) for g, t in tails), rounds=lk.rounds,
                            probes=own_probes[0], error=None)

    # ---------------------------------------------------------------- load
    def plan_load(self, hit: int, tails: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
        """Return (group, block, key boundary): attention blocks 0..c, Mamba block c; the tail block at B_g."""
        if hit <= 0:
            return []
        tail = {int(g): int(b) for g, b in tails}
        out = []
        for i, gr in enumerate(self.g.groups):
            s = self.spans[i]
            c = (hit + s - 1) // s - 1
            for blk in (range(c + 1) if gr.kind == "attention" else (c,)):
                out.append((i, blk, tail[i] if blk == c else (blk + 1) * s))
        return out

    def load(self, chain: Sequence[bytes], hit: int, tails: Sequence[Sequence[int]], kv: RequestKV) -> LoadReport:
        """Get whole physical blocks into a cold cache, zero-copy; report every key's result."""
        assert self.store is not None
        plan = self.plan_load(hit, tails)
        keys, ptrs, sizes = [], [], []
        for i, blk, t in plan:
            dst = kv.io_block(i, blk)
            keys.append(self.key(i, t, chain))
            ptrs.append(dst.data_ptr())
            sizes.append(dst.numel() * dst.element_size())
        rcs = self.store.get(keys, ptrs, sizes)
        kv.stage_in([(i, blk) for (i, blk, _), rc in zip(plan, rcs) if rc >= 0])
        return LoadReport(plan=tuple(plan), keys=tuple(keys), results=tuple(rcs),
                          bytes=sum(r for r in rcs if r > 0))

    # ---------------------------------------------------------------- failure closure
    def safe_boundary(self, hit: int, plan: Sequence[Sequence[int]], ok: Sequence[bool],
                      mamba_present: Callable[[list[Obj]], set[Obj]]) -> int:
        """Return where a partly failed load leaves the request (this implementation's reading of the rule).

        `ok` says per planned block whether every rank loaded it; `mamba_present` probes Mamba keys
        (all ranks) when the fallback below h needs them.
        """
        if hit <= 0:
            return 0
        a = compute_alignment(self.g)
        reach = hit
        for i, gr in enumerate(self.g.groups):
            if gr.kind != "attention":
                continue
            end = 0
            for (g, blk, _), good in zip(plan, ok):
                if g == i:
                    if not good:
                        break
                    end = min((blk + 1) * self.spans[i], hit)
            reach = min(reach, end)
        mambas = [i for i, gr in enumerate(self.g.groups) if gr.kind == "mamba"]
        if not mambas:
            return reach // a * a
        if reach >= hit and all(good for (g, _, _), good in zip(plan, ok) if g in mambas):
            return hit
        top = min(reach, hit - 1) // self.g.unit * self.g.unit
        cands = [t for t in range(top, 0, -self.g.unit) if t % a == 0]
        found = mamba_present([(m, t) for m in mambas for t in cands])
        for t in cands:
            if all((m, t) in found for m in mambas):
                return t
        return 0


STORE_RULES: dict[str, Callable[[RankEngine, int], list[Obj]]] = {
    STORE_PR53324: RankEngine._objects_pr53324,
    STORE_VLLM: RankEngine._objects_vllm,
}
