"""A DCP rank process: `python -m kvspec.impl.worker JOB.json RANK OUT.json`.

Runs every scenario of the job: prefill and store the stored requests, barrier, look up the
lookup request (presence MIN-all-reduced across ranks), load into a cold cache, compare the
loaded region [0, h) with a cold prefill, and write one JSON result per scenario.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .device import needs_staging
from .job import ScenarioJob, decode_job
from .pipeline import RankPipeline


def make_tokens(seed: int, n: int, lo: int = 0, hi: int = 1000) -> list[int]:
    """Return n deterministic tokens in [lo, hi)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=g).tolist()


def request_tokens(base: list[int], seed: int, prompt: int, shared: int) -> list[int]:
    """Return a stored request's tokens: the lookup's first `shared` tokens, then tokens it never has."""
    return base[:shared] + make_tokens(seed, prompt - shared, 1000, 2000)


def run_scenario(pipe: RankPipeline, sc: ScenarioJob) -> dict[str, Any]:
    """Run one scenario on this rank (collective: every rank runs it) and return its JSON result."""
    rank, store, f = pipe.rank, pipe.store, sc.faults
    eng = pipe.engine(sc.prefix, sc.store_rule, sc.lookahead, sc.deferred_saves, sc.decode_states)
    base = make_tokens(sc.seed, sc.prompt)
    t0 = time.perf_counter()
    writers = [pipe.engine(sc.prefix, *sc.writers[k]) if sc.writers else eng for k in range(len(sc.stored))]
    # a request that decoded o tokens: its prompt and outputs (a reader continuing it shares s > p of them)
    stores = [pipe.store_request(writers[k], request_tokens(base, sc.seed * 1000 + k + 1, p + o, s), decoded=o,
                                 decode_saves=c, reput=f.reput)
              for k, (p, s, o, c) in enumerate(sc.stored)]
    predicted = list(sc.predicted_keys.get(rank, ()))
    res: dict[str, Any] = {"stores": [st.to_json() for st in stores],
                           "missing_predicted": [k for k, e in zip(predicted, store.exist(predicted)) if e != 1]}
    for key in f.evict_before_lookup.get(rank, ()):
        store.remove(key, force=True)
    if f.crash_after_store == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    pipe.barrier()
    look = pipe.lookup(eng, base, legacy=sc.tail_at_hit)
    res.update(hit=look.hit, tails=[list(t) for t in look.tails], rounds=look.rounds, probes=look.probes,
               lookup_error=look.error)
    chain = pipe.chain(eng, base)
    removals = [(o, f.evict_force) for o in f.evict_after_lookup.get(rank, ())]
    removals += [(o, False) for o in f.evict_after_lookup_unforced.get(rank, ())]
    if removals:
        res["evicted_rc"] = [store.remove(eng.key(g, t, chain), force=force) for (g, t), force in removals]
    pipe.barrier()
    if f.hold_before_load:  # the parent acts (e.g. restarts the master) while every rank waits here
        sync = Path(f.hold_before_load)
        (sync / f"ready{rank}").touch()
        deadline = time.monotonic() + 60
        while not (sync / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    check = pipe.load_and_check(eng, base, look)
    res.update(check.to_json())
    res["seconds"] = time.perf_counter() - t0
    if f.relookup:
        res["relookup_hit"] = pipe.lookup(eng, base).hit
    return res


def main(argv: list[str]) -> int:
    """Run every scenario of the job in argv[1] as rank argv[2]; write the results to argv[3]."""
    job = decode_job(json.loads(Path(argv[1]).read_text()))
    rank, out_path = int(argv[2]), argv[3]
    pipe = RankPipeline(job, rank)
    results = []
    try:
        for sc in job.scenarios:
            results.append(run_scenario(pipe, sc))
            pipe.barrier()
    finally:
        Path(out_path).write_text(json.dumps({"rank": rank, "device": str(pipe.device),
                                              "backend": pipe.process.backend, "staging": needs_staging(pipe.device),
                                              "scenarios": results}))
        pipe.close()
    return 0


def serve(argv: list[str]) -> int:
    """Serve one rank: JSON commands on stdin, one JSON answer per line on stdout (stateful tests).

    Collective commands (`lookup_load`) must be sent to every rank.
    """
    job = decode_job(json.loads(Path(argv[2]).read_text()))
    pipe = RankPipeline(job, int(argv[3]))
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not corrupt the protocol
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            eng = pipe.engine(cmd.get("prefix", ""))
            ans: dict[str, Any] = {}
            if cmd["op"] == "store":
                ans = pipe.store_request(eng, cmd["tokens"]).to_json()
            elif cmd["op"] == "exist":
                ans = {"exist": pipe.store.exist(cmd["keys"])}
            elif cmd["op"] == "remove":
                ans = {"rc": [pipe.store.remove(k, force=cmd.get("force", True)) for k in cmd["keys"]]}
            elif cmd["op"] == "lookup_load":
                toks = cmd["tokens"]
                look = pipe.lookup(eng, toks, cap=cmd.get("cap"))
                for k in cmd.get("fail_keys", {}).get(str(pipe.rank), []):  # injected: gone between lookup and load
                    pipe.store.remove(k, force=True)
                pipe.barrier()
                check = pipe.load_and_check(eng, toks, look)
                ans = {"hit": look.hit, "tails": [list(t) for t in look.tails], "plan": [list(p) for p in check.load.plan],
                       "keys": list(check.load.keys), "results": list(check.load.results), "ok": list(check.everywhere),
                       "safe": check.safe, "bytes_compared": check.bytes_compared, "bytes_wrong": check.bytes_wrong,
                       "draft_lookahead_bytes": check.draft_lookahead_bytes}
            out.write(json.dumps(ans) + "\n")
            out.flush()
    finally:
        pipe.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv) if sys.argv[1] == "--serve" else main(sys.argv))
