"""A DCP rank running the tiny real model end to end: `python -m kvspec.impl.model_worker JOB.json RANK OUT.json`.

Per scenario (every rank runs it; attention is computed across the ranks):
1. each stored request is prefilled cold in unit chunks, decodes (its draft rows of the last chunk then see the
   sampled token), and RankEngine stores its objects under the scenario's store rule and keys;
2. the lookup request looks up (presence MIN-all-reduced), loads whole blocks into a cold cache, and — when a
   block failed on some rank — retries the lookup capped at the safe boundary (at most RETRIES times, then 0);
3. it prefills from the loaded boundary and decodes `decode` tokens (EAGLE propose/verify with a drafter);
4. the same request runs cold; every logit from the start on and every generated token must be bitwise equal.

A scenario's `FaultPlan.wrong_load` (tests only) breaks the loader on purpose: `neighbour` puts the previous block's
object into the last loaded target-attention block (a key that exists, the wrong one), `skip-mamba` starts from the
initial Mamba state instead of the loaded one. The end-to-end test must then report unequal logits and where.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kvspec.spec.keys import compute_lookahead_chain

from .engine import RankEngine, RequestKV
from .job import Job, ScenarioJob, decode_job
from .model_rank import ModelRunner, RunResult
from .rank import RankProcess
from .tiny_model import LATENT, VOCAB, TinyHybrid

RETRIES = 3  # capped re-lookups after a partly failed load, then the request starts cold
DECODE = 12  # tokens generated per request (EAGLE steps make it ≈ 8 target steps)


def make_tokens(seed: int, n: int) -> list[int]:
    """Return n deterministic tokens of the model's vocabulary."""
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def stored_tokens(base: Sequence[int], seed: int, prompt: int, shared: int) -> list[int]:
    """Return a stored request's tokens: the lookup's first `shared`, then its own (the first one differs)."""
    own = make_tokens(seed, max(prompt - shared, 0))
    if own and shared < len(base) and own[0] == base[shared]:
        own[0] = (own[0] + 1) % VOCAB
    return list(base[:shared]) + own


def gather_ranks(o: torch.Tensor, lse: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Return every rank's (partial output, lse), in rank order (all-gather)."""
    world = dist.get_world_size()
    os_, ls = [torch.empty_like(o) for _ in range(world)], [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(os_, o.contiguous())
    dist.all_gather(ls, lse.contiguous())
    return list(zip(os_, ls))


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Return the first row where two logit tensors differ (bitwise), None when equal (shape differences count)."""
    if a.shape != b.shape:
        return min(a.shape[0], b.shape[0])
    bad = (a.view(torch.int32) != b.view(torch.int32)).any(dim=1).nonzero()
    return int(bad[0]) if len(bad) else None


def _mutate(runner: ModelRunner, eng: RankEngine, chain: Sequence[bytes], hit: int, kv: RequestKV,
            states: list[torch.Tensor], mutant: str | None) -> tuple[list[torch.Tensor], bool]:
    """Return the Mamba states to start from and whether the scenario's wrong load (FaultPlan.wrong_load) changed
    anything."""
    if mutant == "skip-mamba" and states:
        return [runner.model.initial_state() for _ in states], True
    if mutant == "neighbour":
        span = eng.spans[runner.target]
        c = (hit + span - 1) // span - 1
        if c >= 1:  # the previous block's object, put where block c belongs
            dst = kv.io_block(runner.target, c)
            assert eng.store is not None
            eng.store.get([eng.key(runner.target, c * span, chain)], [dst.data_ptr()], [dst.numel() * 4])
            kv.stage_in([(runner.target, c)])
            return states, True
    return states, False


def run_scenario(proc: RankProcess, job: Job, model: TinyHybrid, sc: ScenarioJob) -> dict[str, Any]:
    """Run one scenario on this rank (collective) and return its JSON result."""
    eng = RankEngine(job.geometry, proc.rank, proc.store, proc.device, width=2 * LATENT, model=job.model,
                     cache_prefix=sc.prefix, all_reduce_min=proc.all_reduce_min, store_rule=sc.store_rule,
                     lookahead=sc.lookahead)
    runner = ModelRunner(model, eng, gather_ranks)
    base = make_tokens(sc.seed, sc.prompt)
    extra = 2 * DECODE + 4

    def chain_of(toks: Sequence[int]) -> list[bytes]:
        return list(compute_lookahead_chain(toks, eng.g.unit, eng.lookahead))

    stores = []
    for k, (p, s, o, c) in enumerate(sc.stored):
        if o or c:
            raise ValueError("the model worker decodes its stored requests itself: no decoded count or decode saves")
        toks = stored_tokens(base, sc.seed * 1000 + k + 1, p, s)
        kv = runner.new_cache(p + extra)
        runner.run(toks, kv, DECODE, keep=eng.sub_block_state(p))
        stores.append(len(eng.store_request(toks, chain_of(toks), kv).put))
    proc.barrier()
    chain = chain_of(base)
    t0 = time.perf_counter()
    look = eng.lookup(chain, len(base), legacy=sc.tail_at_hit)
    t_lookup = time.perf_counter() - t0
    removals = sc.faults.evict_after_lookup.get(proc.rank, ())  # this rank's shards gone before the load
    evicted = [eng.store.remove(eng.key(g, t, chain), force=True) for g, t in removals] if eng.store else []
    proc.barrier()
    start, cap, attempts, t_load, mutated = 0, None, [], 0.0, False
    kv = runner.new_cache(len(base) + extra)
    states = [model.initial_state() for _ in runner.mambas]
    hit = look.hit
    for _ in range(RETRIES + 1):
        if cap is not None:
            look = eng.lookup(chain, len(base), legacy=sc.tail_at_hit, cap=cap)
        if look.hit <= 0:
            break
        kv = runner.new_cache(len(base) + extra)
        t0 = time.perf_counter()
        ld = eng.load(chain, look.hit, look.tails, kv)
        t_load += time.perf_counter() - t0
        bits = torch.tensor([1 if rc >= 0 else 0 for rc in ld.results], dtype=torch.int32)
        proc.all_reduce_min(bits)
        attempts.append({"hit": look.hit, "failed": [k for k, rc in zip(ld.keys, ld.results) if rc < 0],
                         "keys": len(ld.keys), "bytes": ld.bytes})
        if bool(bits.all()):
            start = look.hit
            states, mutated = _mutate(runner, eng, chain, start, kv,
                                      [runner.loaded_state(kv, layer, start) for layer in range(len(runner.mambas))],
                                      sc.faults.wrong_load)
            break
        safe = eng.safe_boundary(look.hit, ld.plan, [bool(b) for b in bits.tolist()],
                                 lambda objs: eng.probe_everywhere(objs, chain))
        if safe <= 0:
            break
        cap = safe  # the retry looks up no deeper than where the failed load left the request
    if start == 0:
        kv = runner.new_cache(len(base) + extra)
        states = [model.initial_state() for _ in runner.mambas]
    warm: RunResult = runner.run(base, kv, DECODE, start=start, states=states)
    cold_kv = runner.new_cache(len(base) + extra)
    cold: RunResult = runner.run(base, cold_kv, DECODE)
    differ = runner.differing_rows(kv, cold_kv, start)
    pre = first_difference(cold.prefill_logits[start:].cpu(), warm.prefill_logits.cpu())
    dec = first_difference(cold.decode_logits.cpu(), warm.decode_logits.cpu())
    return {"hit": hit, "start": start, "tails": [list(t) for t in look.tails], "attempts": attempts,
            "stored_puts": stores, "evicted_rc": evicted, "mutated": mutated, "rows_differ": differ,
            "cold_last_logits": cold.prefill_logits[-1].cpu().tolist(),
            "equal": pre is None and dec is None and warm.tokens == cold.tokens,
            "first_prefill_difference": None if pre is None else start + pre, "first_decode_difference": dec,
            "warm_tokens": list(warm.tokens), "cold_tokens": list(cold.tokens),
            "warm_acceptance": [warm.accepted, warm.proposed], "cold_acceptance": [cold.accepted, cold.proposed],
            "seconds": {"lookup": t_lookup, "load": t_load, "warm_compute": warm.seconds, "cold_compute": cold.seconds}}


def main(argv: list[str]) -> int:
    """Run every scenario of the job in argv[1] as rank argv[2]; write the results to argv[3]."""
    torch.set_num_threads(1)  # one thread: the same reduction order in every run
    job = decode_job(json.loads(Path(argv[1]).read_text()))
    rank, out_path = int(argv[2]), argv[3]
    proc = RankProcess(rank, job.master, job.segment_bytes)
    mambas = sum(g.kind == "mamba" for g in job.geometry.groups)
    model = TinyHybrid(mamba_layers=mambas).to(proc.device)
    results = []
    try:
        for sc in job.scenarios:
            results.append(run_scenario(proc, job, model, sc))
            proc.barrier()
    finally:
        Path(out_path).write_text(json.dumps({"rank": rank, "scenarios": results}))
        proc.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
