"""One rank process under load: up to `concurrency` requests in flight, no collectives.

`python -m kvspec.impl.load_worker --serve JOB RANK`, driven by checks/load.py through JSON lines
on stdin/stdout; every command carries an `id` and is answered (in any order) with that id.
Commands run on a thread pool, so stores, lookups and loads of different requests overlap in one
process and one Mooncake client. Nothing here is collective: as in an engine whose scheduler looks
a request up once, `lookup` probes the keys of every DCP rank itself (presence = all ranks have
it) and the driver hands the hit and tail boundaries to every rank's `load`. Each `load` checks its
bytes against a cold prefill up to this rank's safe boundary (failures closed with the rank's own
results), so a wrong byte anywhere is counted, while an eviction or a master restart racing a
load only shortens what is used.

Ops: store, lookup, load, evict, stats, quit.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from kvspec.spec.keys import compute_hash_chain

from .device import select_device
from .engine import Obj, RankEngine, RequestKV, registered
from .job import Job, decode_job
from .lookup import HybridLookup
from .mooncake_store import MooncakeKV
from .worker import make_tokens
from .worker import request_tokens as worker_request_tokens


def request_tokens(cmd: dict[str, Any]) -> list[int]:
    """Return a request's tokens: `shared` tokens of its conversation's prefix, then its own tokens."""
    return worker_request_tokens(make_tokens(cmd["prefix_seed"], cmd["shared"]), cmd["seed"], cmd["prompt"],
                                 cmd["shared"])


class LoadRank:
    """The commands of one rank process (thread-safe: engines are per command, the client is shared)."""

    def __init__(self, job: Job, rank: int) -> None:
        self.g = job.geometry
        self.rank, self.job = rank, job
        self.device = select_device(rank)
        self.store = MooncakeKV(job.master, segment_bytes=job.segment_bytes)

    def engine(self, rank: int) -> RankEngine:
        """Return an engine that renders rank `rank`'s keys (only this rank's engine moves bytes)."""
        return RankEngine(self.g, rank, self.store, self.device, width=self.job.width, model=self.job.model,
                          store_rule=self.job.store_rule)

    def probe_all_ranks(self, objs: list[Obj], chain: Sequence[bytes]) -> set[Obj]:
        """Return the objects whose key exists for every DCP rank."""
        engines = [self.engine(r) for r in range(self.g.parallel.dcp)]
        keys = [e.key(g, t, chain) for g, t in objs for e in engines]
        ex = self.store.exist(keys)
        d = len(engines)
        return {o for k, o in enumerate(objs) if all(x == 1 for x in ex[k * d:(k + 1) * d])}

    def store_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        toks = request_tokens(cmd)
        eng = self.engine(self.rank)
        with registered(self.store, RequestKV(self.g, len(toks), eng.width, self.device)) as kv:
            eng.prefill(toks, kv)
            st = eng.store_request(toks, compute_hash_chain(toks, self.g.unit), kv)
        return {"put": len(st.put), "existing": len(st.existing), "store_full": st.store_full,
                "failed": [rc for _, rc in st.failed], "bytes": st.bytes}

    def lookup_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        toks = request_tokens(cmd)
        chain = compute_hash_chain(toks, self.g.unit)
        lk = HybridLookup(self.g, len(toks))
        try:
            hit, tails = lk.run(lambda objs: self.probe_all_ranks(objs, chain))
        except LookupError as exc:  # a tail key vanished between two probes (a racing eviction): no hit
            return {"hit": 0, "tails": [], "error": str(exc)}
        return {"hit": hit, "tails": [list(t) for t in tails], "error": None}

    def load_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        toks = request_tokens(cmd)
        chain = compute_hash_chain(toks, self.g.unit)
        eng = self.engine(self.rank)
        cold = RequestKV(self.g, len(toks), eng.width, self.device)
        with registered(self.store, cold):
            ld = eng.load(chain, cmd["hit"], cmd["tails"], cold)
        safe = eng.safe_boundary(cmd["hit"], ld.plan, ld.loaded, lambda objs: self.probe_all_ranks(objs, chain))
        compared, wrong, lookahead = eng.compare_with_cold(toks, safe, cold, ld.plan, ld.loaded,
                                                           mamba=safe == cmd["hit"])
        return {"safe": safe, "failed": [rc for _, rc in ld.failed], "bytes": ld.bytes,
                "wrong_in_clean_load": wrong if not ld.failed else 0,
                "bytes_compared": compared, "bytes_wrong": wrong, "draft_lookahead_bytes": lookahead}

    def evict_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        toks = request_tokens(cmd)
        chain = compute_hash_chain(toks, self.g.unit)
        eng = self.engine(self.rank)
        objs = eng.plan_objects(len(toks))
        keys = [eng.key(g, t, chain) for g, t in objs[cmd["start"]::cmd["step"]]]
        return {"removed": sum(self.store.remove(k, force=cmd.get("force", False)) == 0 for k in keys)}

    def stats_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"registered": len(self.store._registered), "threads": threading.active_count()}


def serve(argv: list[str]) -> int:
    job = decode_job(json.loads(Path(argv[2]).read_text()))
    rank = int(argv[3])
    torch.set_num_threads(1)  # the pool, not intra-op threads, provides the parallelism
    lr = LoadRank(job, rank)
    out, lock = sys.stdout, threading.Lock()
    sys.stdout = sys.stderr  # anything else printed must not corrupt the protocol
    ops = {"store": lr.store_op, "lookup": lr.lookup_op, "load": lr.load_op, "evict": lr.evict_op,
           "stats": lr.stats_op}

    def run(cmd: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            ans = {"id": cmd["id"], "ok": True, **ops[cmd["op"]](cmd)}
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which counts it
            ans = {"id": cmd["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "trace": traceback.format_exc(limit=3)}
        ans["seconds"] = time.perf_counter() - t0
        with lock:
            out.write(json.dumps(ans) + "\n")
            out.flush()

    with ThreadPoolExecutor(max_workers=job.concurrency) as pool:
        try:
            for line in sys.stdin:
                cmd = json.loads(line)
                if cmd["op"] == "quit":
                    break
                pool.submit(run, cmd)
        finally:
            pool.shutdown(wait=True)
            lr.store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv))
