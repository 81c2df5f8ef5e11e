"""One DCP rank's pipeline, in one place: store a request, look it up with every rank, load it into a cold
cache, close a partly failed load, check the loaded bytes against a cold prefill.

Every entry point of a rank process runs this object — impl/worker.py (a job of scenarios, and the command
server the stateful tests drive) in a process group, impl/load_worker.py (the load harness) without one
(`collective=False`: each rank probes every rank's keys itself and closes a load on its own results) — so
the steps, the probe and the checks cannot drift apart between them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from kvspec.spec.keys import compute_lookahead_chain

from .cold_check import compare_with_cold
from .engine import RankEngine, RequestKV, registered
from .job import Job
from .mooncake_store import MooncakeKV
from .rank import LocalRank, RankProcess
from .reports import LoadReport, LookupReport, StoreReport


@attrs.frozen(kw_only=True)
class LoadCheck:
    """A load on this rank and its verdict: which blocks every rank got, the safe boundary, the bytes checked."""

    load: LoadReport
    everywhere: tuple[bool, ...]  # per plan entry: every rank loaded it (MIN-all-reduced)
    safe: int  # where the failure closure leaves the request
    bytes_compared: int
    bytes_wrong: int
    draft_lookahead_bytes: int  # mismatches at a draft block's last position (the draft-KV hazard), counted apart
    seconds: float  # the load alone

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object of the check (the load report nested)."""
        return {"load": {**self.load.to_json(), "seconds": self.seconds}, "ok": list(self.everywhere),
                "safe": self.safe, "bytes_compared": self.bytes_compared, "bytes_wrong": self.bytes_wrong,
                "draft_lookahead_bytes": self.draft_lookahead_bytes}


class RankPipeline:
    """This process as one DCP rank of a job: the rank's plumbing (RankProcess) and the steps every entry point runs."""

    def __init__(self, job: Job, rank: int, collective: bool = True) -> None:
        self.job, self.rank, self.geometry = job, rank, job.geometry
        self.process: RankProcess | LocalRank = (RankProcess if collective else LocalRank)(rank, job.master,
                                                                                           job.segment_bytes)

    @property
    def store(self) -> MooncakeKV:
        return self.process.store

    @property
    def device(self) -> torch.device:
        return self.process.device

    def engine(self, prefix: str = "", store_rule: str | None = None, lookahead: int | None = None,
               deferred_saves: bool = False, decode_states: bool = False) -> RankEngine:
        """Return this rank's engine for one key namespace (store rule and λ: the job's unless given)."""
        return RankEngine(self.geometry, self.rank, self.store, self.device, width=self.job.width, model=self.job.model,
                          cache_prefix=prefix, all_reduce_min=self.process.all_reduce_min,
                          store_rule=store_rule or self.job.store_rule,
                          lookahead=self.job.lookahead if lookahead is None else lookahead,
                          deferred_saves=deferred_saves, decode_states=decode_states,
                          probe_all_ranks=not self.process.collective)

    def chain(self, eng: RankEngine, tokens: Sequence[int]) -> list[bytes]:
        """Return the request's hash chain (each hash covering λ tokens past its unit)."""
        return list(compute_lookahead_chain(tokens, self.geometry.unit, eng.lookahead))

    def store_request(self, eng: RankEngine, tokens: Sequence[int], decoded: int = 0,
                      decode_saves: bool = False, reput: bool = False) -> StoreReport:
        """Prefill the request into a registered cache and store its objects (`decoded`: the last tokens are outputs
        it decoded before finishing; the chain hashes them too, and the KV is computed through them, as its decode
        steps did: the drafter read the first output; `decode_saves`: save_decode_cache)."""
        prompt = tokens[:len(tokens) - decoded]
        with registered(self.store, RequestKV(self.geometry, len(tokens), eng.width, self.device)) as kv:
            eng.prefill(tokens, kv, prompt=len(prompt))
            return eng.store_request(prompt, self.chain(eng, tokens), kv, decoded=decoded, decode_saves=decode_saves,
                                     reput=reput)

    def lookup(self, eng: RankEngine, tokens: Sequence[int], legacy: bool = False, cap: int | None = None) -> LookupReport:
        """Return the hit and tail boundaries every rank agrees on (collective)."""
        return eng.lookup(self.chain(eng, tokens), len(tokens), legacy=legacy, cap=cap)

    def load_and_check(self, eng: RankEngine, tokens: Sequence[int], look: LookupReport) -> LoadCheck:
        """Load the hit into a cold cache, close what failed on any rank, compare [0, safe) with a cold prefill
        (collective)."""
        chain = self.chain(eng, tokens)
        cold = RequestKV(self.geometry, len(tokens), eng.width, self.device)
        t0 = time.perf_counter()
        with registered(self.store, cold):
            ld = eng.load(chain, look.hit, look.tails, cold)
        seconds = time.perf_counter() - t0
        bits = torch.tensor([1 if x else 0 for x in ld.loaded], dtype=torch.int32)
        self.process.all_reduce_min(bits)  # a block counts only if every rank loaded it
        everywhere = tuple(bool(x) for x in bits.tolist())
        safe = eng.safe_boundary(look.hit, ld.plan, everywhere, lambda objs: eng.probe_everywhere(objs, chain))
        compared, wrong, draft = compare_with_cold(eng, tokens, safe, cold, ld.plan, everywhere, mamba=safe == look.hit)
        return LoadCheck(load=ld, everywhere=everywhere, safe=safe, bytes_compared=compared, bytes_wrong=wrong,
                         draft_lookahead_bytes=draft, seconds=seconds)

    def barrier(self) -> None:
        """Wait for every rank."""
        self.process.barrier()

    def close(self) -> None:
        """Close the store client and leave the process group."""
        self.process.close()
