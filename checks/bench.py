"""`make bench` / `kvspec bench --json`: lookup probes and transfer throughput, ratios against baselines
measured in the same run.

(a) lookup: existence probes and rounds of the implementation's lookup versus vLLM's way (probe
    every unit boundary of every group on every rank), on kimi-k3-dcp8 with an identical resend
    stored, at N = 32k, 128k and 1M tokens; the hit and tail boundaries must be identical to the
    spec's (which is what the full probe yields).
(b) transfer: the implementation's store and load paths (existence check, key rendering,
    zero-copy batch put/get from the paged KV tensors) against raw Mooncake `batch_put_from` /
    `batch_get_into` of the same bytes, on a real master, in one process.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario


def bench_lookup(sizes: tuple[int, ...] = (32_768, 131_072, 1_048_576),
                 rule_sets: tuple[str, ...] = ("pr53324", "vllm-0.33.0")) -> list[dict[str, Any]]:
    """Return one row per rule set and prompt size (identical resend): probes, baseline probes, rounds, identical."""
    from kvspec.impl.lookup import HybridLookup, count_baseline_probes
    g = get_preset("kimi-k3-dcp8")
    rows = []
    for rules, n in ((r, n) for r in rule_sets for n in sizes):
        sc = Scenario(geometry=g, prompt=n, stored=(StoredRequest(prompt=n, shared=n),), rules=rules)
        spec = evaluate_scenario(sc)
        rounds: list[int] = []
        lk = HybridLookup(g, n)
        t0 = time.perf_counter()
        present = {(int(gid), int(t)) for gid, t in spec.present}

        def probe(objs: list[tuple[int, int]], present: set[tuple[int, int]] = present,
                  rounds: list[int] = rounds) -> set[tuple[int, int]]:
            rounds.append(len(objs))
            return {o for o in objs if o in present}

        h, tails = lk.run(probe)
        dt = time.perf_counter() - t0
        probes = lk.probes * g.parallel.dcp  # every rank probes its own keys
        base = count_baseline_probes(g, n)
        rows.append({"rules": rules, "tokens": n, "probes": probes, "baseline_probes": base, "ratio": round(base / probes, 2),
                     "rounds": lk.rounds, "baseline_rounds": 1, "identical": h == spec.hit_length
                     and tuple(tails) == spec.tails, "hit_length": h, "lookup_cpu_s": round(dt, 4)})
    return rows


def bench_transfer(repeats: int = 5, width: int = 256, prompt: int = 131_072) -> dict[str, Any]:
    """Return store/load throughput ratios (ours / raw Mooncake) for the same bytes on a real master."""
    import torch

    from kvspec.impl.cluster import running_master
    from kvspec.impl.engine import RankEngine, RequestKV
    from kvspec.impl.mooncake_store import MooncakeKV
    from kvspec.impl.worker import make_tokens
    from kvspec.spec.keys import compute_hash_chain

    g = get_preset("kimi-k3-dcp8")
    ours_put: list[float] = []
    raw_put: list[float] = []
    ours_get: list[float] = []
    raw_get: list[float] = []
    sizes_seen: list[int] = []
    load_seen: list[int] = []
    with running_master() as m:
        store = MooncakeKV(m.address, segment_bytes=1 << 30, local_buffer_bytes=16 << 20)
        try:
            for k in range(repeats + 1):  # iteration 0 warms the segment up and is not counted
                first_ours = k % 2 == 0  # alternate which path runs first: no order bias
                eng = RankEngine(g, 0, store, torch.device("cpu"), width=width, cache_prefix=f"bench-{k}")
                toks = make_tokens(k + 1, prompt)
                chain = compute_hash_chain(toks, g.unit)
                kv = RequestKV(g, prompt, width, torch.device("cpu"))
                eng.prefill(toks, kv)
                for t in kv.tensors:  # registered once per slab (unregistered below, before the memory goes)
                    store.register(t.data_ptr(), t.nbytes)
                objs = eng.plan_objects(prompt)
                bufs = [eng.object_buffer(kv, i, t) for i, t in objs]  # the same bytes the store path puts
                ptrs, sizes = [b.data_ptr() for b in bufs], [b.nbytes for b in bufs]
                raw_keys = [f"raw-{k}-{j}" for j in range(len(objs))]

                def ours_store() -> None:
                    t0 = time.perf_counter()
                    st = eng.store_request(toks, chain, kv)  # plan, keys, existence check, zero-copy put  # noqa: B023 - called within this iteration
                    ours_put.append(time.perf_counter() - t0)
                    assert len(st["put"]) == len(objs), st  # noqa: B023 - called within this iteration
                    sizes_seen.append(st["bytes"])

                def raw_store() -> None:
                    t0 = time.perf_counter()
                    rc = store.put(raw_keys, ptrs, sizes)  # noqa: B023 - called within this iteration
                    raw_put.append(time.perf_counter() - t0)
                    assert all(r == 0 for r in rc), rc

                for fn in ((ours_store, raw_store) if first_ours else (raw_store, ours_store)):
                    fn()
                spec = evaluate_scenario(Scenario(geometry=g, prompt=prompt,
                                                  stored=(StoredRequest(prompt=prompt, shared=prompt),)))
                tails = [list(x) for x in spec.tails]
                cold_a = RequestKV(g, prompt, width, torch.device("cpu"))
                cold_b = RequestKV(g, prompt, width, torch.device("cpu"))
                for t in (*cold_a.tensors, *cold_b.tensors):
                    store.register(t.data_ptr(), t.nbytes)
                plan = eng.plan_load(spec.hit_length, tails)
                keys = [eng.key(i, t, chain) for i, _, t in plan]
                dst = [cold_b.block(i, b).data_ptr() for i, b, _ in plan]
                dsz = [cold_b.block(i, b).nbytes for i, b, _ in plan]

                def ours_load() -> None:
                    t0 = time.perf_counter()
                    ld = eng.load(chain, spec.hit_length, tails, cold_a)  # plan, keys, zero-copy get  # noqa: B023 - called within this iteration
                    ours_get.append(time.perf_counter() - t0)
                    assert not ld["failed"], ld["failed"]
                    load_seen.append(ld["bytes"])

                def raw_load() -> None:
                    t0 = time.perf_counter()
                    rg = store.get(keys, dst, dsz)  # noqa: B023 - called within this iteration
                    raw_get.append(time.perf_counter() - t0)
                    assert all(r >= 0 for r in rg), rg

                for fn in ((ours_load, raw_load) if first_ours else (raw_load, ours_load)):
                    fn()
                for t in (*kv.tensors, *cold_a.tensors, *cold_b.tensors):
                    store.unregister(t.data_ptr())
                if k == 0:
                    for lst in (ours_put, raw_put, ours_get, raw_get):
                        lst.clear()
        finally:
            store.close()
    med = statistics.median
    nbytes, load_bytes = sizes_seen[-1], load_seen[-1]
    return {"put_ratio": round(med(raw_put) / med(ours_put), 3), "get_ratio": round(med(raw_get) / med(ours_get), 3),
            "bytes": nbytes, "load_bytes": load_bytes, "repeats": repeats,
            "put_s": {"ours": round(med(ours_put), 5), "raw": round(med(raw_put), 5)},
            "get_s": {"ours": round(med(ours_get), 5), "raw": round(med(raw_get), 5)},
            "put_gib_s": round(nbytes / med(ours_put) / 2**30, 3), "get_gib_s": round(load_bytes / med(ours_get) / 2**30, 3)}


def bench_efficiency(rule_sets: tuple[str, ...] = ("pr53324", "vllm-0.33.0"), step: int = 7) -> list[dict[str, Any]]:
    """Return, per geometry, retention and rule set, the identical-resend hit over a sweep of prompt lengths.

    Kimi-K3 (DCP 8): P = L+1 … 2L−2 in steps of `step`, plus the 10^6-token resend; a small geometry
    (u = 4, b = 16, D = 2) over one scheduler block in steps of 1. Reusable tokens of a resend are
    ⌊P/u⌋·u − u (the last unit is recomputed: the logits need the last token, EAGLE drops a unit).
    """
    import attrs

    from kvspec.spec.geometry import compute_lcm_span, make_geometry
    small = make_geometry(4, [("attention", 16, True), ("mamba", 16, False)], dcp=2)
    rows = []
    for name, base, stride in (("kimi-k3-dcp8", get_preset("kimi-k3-dcp8"), step), ("small-dcp2", small, 1)):
        lcm, u = compute_lcm_span(base), base.unit
        for retention in ("replay", "dense"):
            g = attrs.evolve(base, retention=retention)
            for rules in rule_sets:
                n = zero = got = reusable = 0
                for p in range(lcm + 1, 2 * lcm - 1, stride):
                    h = evaluate_scenario(Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),),
                                                   rules=rules)).hit_length
                    n, zero, got, reusable = n + 1, zero + (h == 0), got + h, reusable + p // u * u - u
                row = {"geometry": name, "retention": retention, "rules": rules, "prompts": n,
                       "zero_hits": zero, "zero_hit_fraction": round(zero / n, 4),
                       "reused_over_reusable": round(got / reusable, 4)}
                if name == "kimi-k3-dcp8":
                    big = 10**6
                    row["hit_at_1m"] = evaluate_scenario(Scenario(geometry=g, prompt=big, rules=rules,
                                                                  stored=(StoredRequest(prompt=big, shared=big),))).hit_length
                rows.append(row)
    return rows


def run_bench(quick: bool = False) -> int:
    """Print the benchmark JSON object; return 0."""
    import torch
    out = {"lookup": bench_lookup((32_768, 131_072) if quick else (32_768, 131_072, 1_048_576)),
           "efficiency": bench_efficiency(step=49 if quick else 7),
           "transfer": bench_transfer(repeats=2 if quick else 5),
           "device": "cuda" if torch.cuda.is_available() else "cpu"}
    print(json.dumps(out, indent=2))
    return 0
