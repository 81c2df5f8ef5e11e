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

from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import compute_hash_chain, compute_lookahead_chain

from .device import needs_staging
from .engine import RankEngine, RequestKV, registered
from .rank import RankProcess


def geometry_from_json(d: dict[str, Any]) -> Geometry:
    """Return the Geometry of a job."""
    return Geometry(unit=d["unit"], groups=tuple(Group(kind=g["kind"], block_size=g["block_size"], eagle=g["eagle"])
                                                  for g in d["groups"]),
                    parallel=Parallel(dcp=d["dcp"]), retention=d["retention"])


def make_tokens(seed: int, n: int, lo: int = 0, hi: int = 1000) -> list[int]:
    """Return n deterministic tokens in [lo, hi)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=g).tolist()


def request_tokens(base: list[int], seed: int, prompt: int, shared: int) -> list[int]:
    """Return a stored request's tokens: the lookup's first `shared` tokens, then tokens it never has."""
    return base[:shared] + make_tokens(seed, prompt - shared, 1000, 2000)


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    rank, out_path = int(argv[2]), argv[3]
    rp = RankProcess(rank, job)
    geometry = geometry_from_json(job["geometry"])
    device, backend, store, all_reduce_min = rp.device, rp.backend, rp.store, rp.all_reduce_min

    results = []
    try:
        for sc in job["scenarios"]:
            lookahead = sc.get("lookahead", 0)  # hash lookahead λ: keys name [0, t + λ)
            eng = RankEngine(geometry, rank, store, device, width=job.get("width", 8), model=job["model"],
                             cache_prefix=sc["prefix"], all_reduce_min=all_reduce_min,
                             store_rule="vllm-0.33.0" if sc["rules"].startswith("vllm-0.33.0") else "pr53324",
                             lookahead=lookahead)
            u = geometry.unit
            base = make_tokens(sc["seed"], sc["prompt"])
            res: dict[str, Any] = {"stores": []}
            t0 = time.perf_counter()
            for k, r in enumerate(sc["stored"]):
                toks = request_tokens(base, sc["seed"] * 1000 + k + 1, r["prompt"], r["shared"])
                with registered(store, RequestKV(geometry, len(toks), eng.width, device)) as kv:
                    eng.prefill(toks, kv)
                    res["stores"].append(eng.store_request(toks, compute_lookahead_chain(toks, u, lookahead),
                                                           kv).to_json())
            predicted = sc.get("predicted_keys", {}).get(str(rank), [])
            ex = store.exist(predicted)
            res["missing_predicted"] = [k for k, e in zip(predicted, ex) if e != 1]
            for key in sc.get("evict", {}).get(str(rank), []):
                store.remove(key, force=True)
            if sc.get("crash_after_store") == rank:  # fault injection: this rank process dies (SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            rp.barrier()
            chain = compute_lookahead_chain(base, u, lookahead)
            look = eng.lookup(chain, sc["prompt"], legacy=sc["rules"] == "legacy")
            res.update(hit=look.hit, tails=[list(t) for t in look.tails], rounds=look.rounds, probes=look.probes,
                       lookup_error=look.error)
            # fault injection: objects removed (forced) from this rank's keys between lookup and load
            force = sc.get("evict_force", True)  # False: a lease (granted by the lookup's exist) may block it
            for gid, t in sc.get("evict_after_lookup", {}).get(str(rank), []):
                res.setdefault("evicted_rc", []).append(store.remove(eng.key(gid, t, chain), force=force))
            for gid, t in sc.get("evict_after_lookup_unforced", {}).get(str(rank), []):
                res.setdefault("evicted_rc", []).append(store.remove(eng.key(gid, t, chain), force=False))
            rp.barrier()
            if sc.get("sync_dir"):  # fault injection: the parent acts (e.g. kills the master) before the load
                sync = Path(sc["sync_dir"])
                (sync / f"ready{rank}").touch()
                deadline = time.monotonic() + 60
                while not (sync / "go").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            cold = RequestKV(geometry, sc["prompt"], eng.width, device)
            t_load = time.perf_counter()
            with registered(store, cold):
                ld = eng.load(chain, look.hit, look.tails, cold)
            res["load"] = {**ld.to_json(), "seconds": time.perf_counter() - t_load}
            # failure closure: a block counts only if every rank loaded it
            ok = torch.tensor([1 if x else 0 for x in ld.loaded], dtype=torch.int32)
            all_reduce_min(ok)

            def probe(objs: list[tuple[int, int]]) -> set[tuple[int, int]]:
                ex = store.exist([eng.key(g, t, chain) for g, t in objs])  # noqa: B023 - called within this iteration
                bits = torch.tensor([1 if e == 1 else 0 for e in ex], dtype=torch.int32)
                all_reduce_min(bits)
                return {o for o, b in zip(objs, bits.tolist()) if b}

            everywhere = [bool(x) for x in ok.tolist()]
            safe = eng.safe_boundary(look.hit, ld.plan, everywhere, probe)
            res["safe"] = safe
            cmp_, wrong, lookahead = eng.compare_with_cold(base, safe, cold, ld.plan, everywhere, mamba=safe == look.hit)
            res.update(bytes_compared=cmp_, bytes_wrong=wrong, draft_lookahead_bytes=lookahead,
                       seconds=time.perf_counter() - t0)
            if sc.get("relookup"):  # what a retry would see now
                again = eng.lookup(chain, sc["prompt"])
                res["relookup_hit"] = again.hit
            results.append(res)
            rp.barrier()
    finally:
        Path(out_path).write_text(json.dumps({"rank": rank, "device": str(device), "backend": backend,
                                              "staging": needs_staging(device), "scenarios": results}))
        rp.close()
    return 0


def serve(argv: list[str]) -> int:
    """Serve one rank: JSON commands on stdin, one JSON answer per line on stdout (stateful tests).

    Collective commands (`lookup_load`) must be sent to every rank.
    """
    job = json.loads(Path(argv[2]).read_text())
    rank = int(argv[3])
    rp = RankProcess(rank, job)
    geometry = geometry_from_json(job["geometry"])
    device, store, all_reduce_min = rp.device, rp.store, rp.all_reduce_min  # the NCCL device hop included

    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not corrupt the protocol
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            eng = RankEngine(geometry, rank, store, device, width=job.get("width", 4), model=job["model"],
                             cache_prefix=cmd.get("prefix", ""), all_reduce_min=all_reduce_min,
                             store_rule=job.get("store_rule", "pr53324"))
            ans: dict[str, Any] = {}
            if cmd["op"] == "store":
                toks = cmd["tokens"]
                with registered(store, RequestKV(geometry, len(toks), eng.width, device)) as kv:
                    eng.prefill(toks, kv)
                    ans = eng.store_request(toks, compute_hash_chain(toks, geometry.unit), kv).to_json()
            elif cmd["op"] == "exist":
                ans = {"exist": store.exist(cmd["keys"])}
            elif cmd["op"] == "remove":
                ans = {"rc": [store.remove(k, force=cmd.get("force", True)) for k in cmd["keys"]]}
            elif cmd["op"] == "lookup_load":
                toks = cmd["tokens"]
                chain = compute_hash_chain(toks, geometry.unit)
                look = eng.lookup(chain, len(toks), cap=cmd.get("cap"))
                for k in cmd.get("fail_keys", {}).get(str(rank), []):  # injected: gone between lookup and load
                    store.remove(k, force=True)
                rp.barrier()
                cold = RequestKV(geometry, len(toks), eng.width, device)
                with registered(store, cold):
                    ld = eng.load(chain, look.hit, look.tails, cold)
                ok = torch.tensor([1 if x else 0 for x in ld.loaded], dtype=torch.int32)
                all_reduce_min(ok)

                def probe(objs: list[tuple[int, int]], chain: Any = chain, eng: RankEngine = eng) -> set[Any]:
                    bits = torch.tensor([1 if e == 1 else 0 for e in store.exist([eng.key(g, t, chain)
                                                                                   for g, t in objs])],
                                        dtype=torch.int32)
                    all_reduce_min(bits)
                    return {o for o, b in zip(objs, bits.tolist()) if b}

                oks = [bool(x) for x in ok.tolist()]
                safe = eng.safe_boundary(look.hit, ld.plan, oks, probe)
                cmp_, wrong, lookahead = eng.compare_with_cold(toks, safe, cold, ld.plan, oks, mamba=safe == look.hit)
                ans = {"hit": look.hit, "tails": [list(t) for t in look.tails], "plan": [list(p) for p in ld.plan],
                       "keys": list(ld.keys), "results": list(ld.results), "ok": oks, "safe": safe, "bytes_compared": cmp_,
                       "bytes_wrong": wrong, "draft_lookahead_bytes": lookahead}
            out.write(json.dumps(ans) + "\n")
            out.flush()
    finally:
        rp.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv) if sys.argv[1] == "--serve" else main(sys.argv))
