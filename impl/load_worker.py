"""One rank process under load: up to `concurrency` requests in flight, no collectives.

`python -m kvspec.impl.load_worker --serve JOB RANK`, driven by checks/bench/load.py through JSON lines
on stdin/stdout; every command carries an `id` and is answered (in any order) with that id.
Commands run on a thread pool, so stores, lookups and loads of different requests overlap in one
process and one Mooncake client. Every command is a step of the rank pipeline (impl/pipeline.py) without a
process group: as in an engine whose scheduler looks a request up once, `lookup` probes the keys of every
DCP rank itself (presence = all ranks have it) and the driver hands the hit and tail boundaries to every
rank's `load`. Each `load` checks its bytes against a cold prefill up to this rank's safe boundary
(failures closed with the rank's own results), so a wrong byte anywhere is counted, while an eviction or a
master restart racing a load only shortens what is used.

Ops: store, lookup, load, evict, stats, quit.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from .job import Job, decode_job
from .pipeline import RankPipeline
from .reports import LookupReport
from .worker import make_tokens
from .worker import request_tokens as worker_request_tokens


def request_tokens(cmd: dict[str, Any]) -> list[int]:
    """Return a request's tokens: `shared` tokens of its conversation's prefix, then its own tokens."""
    return worker_request_tokens(make_tokens(cmd["prefix_seed"], cmd["shared"]), cmd["seed"], cmd["prompt"],
                                 cmd["shared"])


class LoadRank:
    """The commands of one rank process (thread-safe: engines are per command, the client is shared)."""

    def __init__(self, job: Job, rank: int) -> None:
        self.pipe = RankPipeline(job, rank, collective=False)

    def store_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        st = self.pipe.store_request(self.pipe.engine(), request_tokens(cmd))
        return {"put": len(st.put), "existing": len(st.existing), "store_full": st.store_full,
                "failed": [rc for _, rc in st.failed], "bytes": st.bytes}

    def lookup_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        look = self.pipe.lookup(self.pipe.engine(), request_tokens(cmd))
        # a tail key that vanished between two probes (a racing eviction) is no hit
        return {"hit": look.hit, "tails": [list(t) for t in look.tails], "error": look.error}

    def load_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        look = LookupReport(hit=cmd["hit"], tails=tuple((int(g), int(t)) for g, t in cmd["tails"]), rounds=0,
                            probes=0, error=None)
        chk = self.pipe.load_and_check(self.pipe.engine(), request_tokens(cmd), look)
        failed = chk.load.failed
        return {"safe": chk.safe, "failed": [rc for _, rc in failed], "bytes": chk.load.bytes,
                "wrong_in_clean_load": chk.bytes_wrong if not failed else 0,
                "bytes_compared": chk.bytes_compared, "bytes_wrong": chk.bytes_wrong,
                "draft_lookahead_bytes": chk.draft_lookahead_bytes}

    def evict_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        toks = request_tokens(cmd)
        eng = self.pipe.engine()
        chain = self.pipe.chain(eng, toks)
        keys = [eng.key(g, t, chain) for g, t in eng.plan_objects(len(toks))[cmd["start"]::cmd["step"]]]
        return {"removed": sum(self.pipe.store.remove(k, force=cmd.get("force", False)) == 0 for k in keys)}

    def stats_op(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"registered": self.pipe.store.registered_count, "threads": threading.active_count()}


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
            lr.pipe.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv))
