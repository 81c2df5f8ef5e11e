"""One rank of the transfer bench: the implementation's store and load paths against raw Mooncake batch calls.

`python -m kvspec.impl.transfer_bench JOB RANK OUT`, started D times by checks/bench/runner.py through
cluster.run_ranks. Each rank builds a request's paged KV at a realistic layout (attention slots of
`width` float32 per token, Mamba states of `mamba_width`), then per iteration, all ranks in step:
store through RankEngine.store_request (plan, keys, existence check, zero-copy put) and put the very
same buffers under other keys with one raw batch put; look up (collective), then load through
RankEngine.load (plan, keys, zero-copy get) and get the same keys with one raw batch get. The order of
ours/raw alternates per iteration; iteration 0 warms up and is not reported. Content is random: the
differential tests, not this bench, check bytes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kvspec.spec.keys import compute_hash_chain

from .device import needs_staging
from .engine import RequestKV, registered
from .job import decode_job
from .pipeline import RankPipeline
from .worker import make_tokens


def main(argv: list[str]) -> int:
    job = decode_job(json.loads(Path(argv[1]).read_text()))
    rank, out_path = int(argv[2]), argv[3]
    if job.transfer is None:
        raise SystemExit("transfer_bench: the job has no transfer plan")
    pipe = RankPipeline(job, rank)
    rp, device, store = pipe.process, pipe.device, pipe.store
    g, plan = job.geometry, job.transfer
    n, width, mwidth = plan.tokens, job.width, plan.mamba_width

    def timed(fn: Any) -> tuple[float, Any]:
        rp.barrier()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, out

    toks = make_tokens(1, n)
    chain = compute_hash_chain(toks, g.unit)

    def iteration(k: int) -> dict[str, Any]:
        """Return one iteration's figures (all ranks in step)."""
        eng = pipe.engine(f"tb{k}")
        hot = RequestKV(g, n, width, device, mamba_width=mwidth)
        cold_a = RequestKV(g, n, width, device, mamba_width=mwidth)
        cold_b = RequestKV(g, n, width, device, mamba_width=mwidth)
        for t in hot.tensors:
            t.copy_(torch.rand(t.shape, device=device))
        with registered(store, hot), registered(store, cold_a), registered(store, cold_b):
            objs = eng.plan_objects(n)
            bufs = [eng.object_buffer(hot, i, t) for i, t in objs]
            raw_keys = [f"raw-{k}-{rank}-{j}" for j in range(len(objs))]
            ptrs, sizes = [b.data_ptr() for b in bufs], [b.nbytes for b in bufs]
            ours_first = k % 2 == 0

            def ours_put() -> Any:
                return eng.store_request(toks, chain, hot)

            def raw_put() -> Any:
                hot.stage_out([(i, eng.object_block(hot, i, t)) for i, t in objs])  # as the store path does
                return store.put(raw_keys, ptrs, sizes)

            put = {}
            for name, fn in ((("ours", ours_put), ("raw", raw_put)) if ours_first
                             else (("raw", raw_put), ("ours", ours_put))):
                put[name] = timed(fn)
            st, rc = put["ours"][1], put["raw"][1]
            assert not st.failed and st.store_full == 0 and all(r == 0 for r in rc), (st, rc)
            look = eng.lookup(chain, n)
            plan = eng.plan_load(look.hit, look.tails)
            keys = [eng.key(i, t, chain) for i, _, t in plan]
            dst = [cold_b.io_block(i, b) for i, b, _ in plan]

            def ours_get() -> Any:
                return eng.load(chain, look.hit, look.tails, cold_a)

            def raw_get() -> Any:
                rcs = store.get(keys, [d.data_ptr() for d in dst], [d.nbytes for d in dst])
                cold_b.stage_in([(i, b) for i, b, _ in plan])  # as the load path does
                return rcs

            get = {}
            for name, fn in ((("ours", ours_get), ("raw", raw_get)) if ours_first
                             else (("raw", raw_get), ("ours", ours_get))):
                get[name] = timed(fn)
            ld, rg = get["ours"][1], get["raw"][1]
            assert not ld.failed and all(r >= 0 for r in rg), (ld.failed, rg)
            same = all(torch.equal(cold_a.block(i, b), cold_b.block(i, b)) for i, b, _ in plan)
            row = {"put_bytes": st.bytes, "raw_put_bytes": sum(sizes),
                   "get_bytes": ld.bytes, "raw_get_bytes": sum(r for r in rg if r > 0),
                   "put_s": {"ours": put["ours"][0], "raw": put["raw"][0]},
                   "get_s": {"ours": get["ours"][0], "raw": get["raw"][0]},
                   "hit": look.hit, "objects": len(objs), "loads": len(plan), "same_bytes": same}
            for key in [*st.put, *raw_keys]:  # free the segment for the next iteration
                store.remove(key, force=True)
            return row

    rows: list[dict[str, Any]] = []
    hot_staging = needs_staging(device)
    try:
        for k in range(plan.repeats + 1):
            row = iteration(k)
            if k > 0:  # iteration 0 warms up
                rows.append(row)
        rp.barrier()
        Path(out_path).write_text(json.dumps({"rank": rank, "device": str(device), "backend": rp.backend,
                                              "staging": hot_staging, "rows": rows}))
    finally:
        pipe.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
