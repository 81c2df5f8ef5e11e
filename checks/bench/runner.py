"""`make bench` / `kvspec bench --json`: lookup probes and transfer throughput, ratios against baselines
measured in the same run.

(a) lookup: existence probes and rounds of the implementation's lookup versus vLLM's way (probe
    every unit boundary of every group on every rank), on kimi-k3-dcp8 with an identical resend
    stored, at N = 32k, 128k and 1M tokens; the hit and tail boundaries must be identical to the
    spec's (which is what the full probe yields).
(b) transfer: the implementation's store and load paths (existence check, key rendering,
    zero-copy batch put/get from the paged KV tensors) against raw Mooncake `batch_put_from` /
    `batch_get_into` of the same bytes, D rank processes over TCP to a real master, at a realistic
    layout (LayerLayout: a Kimi-Linear-class hybrid), with this machine's memcpy bandwidth for context.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from kvspec.checks.bench.load import run_load
from kvspec.checks.calibration import format_calibrated, measure_calibration, measure_cpu_seconds
from kvspec.checks.conform.adapters import compute_impl_store_rule
from kvspec.checks.output import write_output_file
from kvspec.checks.rulesets import list_rules
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Parallel, compute_lcm_span, compute_rank_fields, compute_ranks, make_geometry
from kvspec.spec.keys import StoreKey, render_key
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import VLLM_0_33, VLLM_0_34, compute_lookahead, compute_rule_geometry, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.schedule import Schedule, compute_checkpoints

MEASURED = list_rules("bench")  # the rule sets the bench compares (checks/rulesets.py)


def bench_lookup(sizes: tuple[int, ...] = (32_768, 131_072, 1_048_576),
                 rule_sets: tuple[str, ...] = MEASURED, master: str | None = None,
                 geometry: Any = None) -> list[dict[str, Any]]:
    """Return one row per rule set and prompt size (identical resend on kimi-k3-dcp8, or `geometry`): probes, baseline
    probes, rounds, identical; with a master address also the wall time of the existence calls on that real master
    (every rank's keys in one batch_is_exist per round) against vLLM's one call of every rank's unit-boundary keys."""
    from kvspec.impl.lookup import HybridLookup, count_baseline_probes
    g = geometry or get_preset("kimi-k3-dcp8")
    client = _ProbeClient(master, g) if master else None
    rows = []
    try:
        for rules, n in ((r, n) for r in rule_sets for n in sizes):
            sc = Scenario(geometry=g, prompt=n, stored=(StoredRequest(prompt=n, shared=n),), rules=rules)
            spec = evaluate_scenario(sc)
            lk = HybridLookup(g, n, lookahead=compute_lookahead(get_rules(rules), g))
            present = {(int(gid), int(t)) for gid, t in spec.present}
            if client is not None:
                client.put_present(f"{rules}/{n}", present)

            def probe(objs: list[tuple[int, int]], present: set[tuple[int, int]] = present,
                      tag: str = f"{rules}/{n}") -> set[tuple[int, int]]:
                return client.probe(tag, objs) if client is not None else {o for o in objs if o in present}

            t0 = time.perf_counter()
            h, tails = lk.run(probe)
            dt = time.perf_counter() - t0
            probes = lk.probes * g.parallel.dcp  # every rank probes its own keys
            base = count_baseline_probes(g, n)
            row = {"rules": rules, "tokens": n, "probes": probes, "baseline_probes": base,
                   "ratio": round(base / probes, 2), "rounds": lk.rounds, "baseline_rounds": 1,
                   "identical": h == spec.hit_length and tuple(tails) == spec.tails, "hit_length": h,
                   "lookup_cpu_s": round(dt, 4)}
            if client is not None:
                row["master_ms"] = round(client.take_seconds() * 1e3, 2)
                row["baseline_master_ms"] = round(client.time_baseline(f"{rules}/{n}", n) * 1e3, 2)
            rows.append(row)
    finally:
        if client is not None:
            client.close()
    return rows


class _ProbeClient:
    """One client of a real master that holds every rank's keys of the bench's stored objects (64-byte values) and
    times the existence calls (key rendering excluded)."""

    VALUE = 64

    def __init__(self, master: str, geometry: Any) -> None:
        import numpy as np

        from kvspec.impl.mooncake_store import MooncakeKV
        self.kv = MooncakeKV(master, segment_bytes=64 << 20)
        self.g = geometry
        self.fields = [compute_rank_fields(geometry, r) for r in compute_ranks(geometry)]
        self.buf = np.zeros(self.VALUE, dtype=np.uint8)
        self.kv.register(self.buf.ctypes.data, self.VALUE)
        self.seconds = 0.0

    def keys(self, tag: str, objs: list[tuple[int, int]]) -> list[str]:
        return [render_key(StoreKey(model="kvspec-bench", tp_rank=f.tp_rank, pcp_rank=f.pcp_rank, dcp_rank=f.dcp_rank,
                                    pp_rank=f.pp_rank, group=g, hash_hex=_bench_hash(tag, t)))
                for g, t in objs for f in self.fields]

    def put_present(self, tag: str, present: set[tuple[int, int]]) -> None:
        keys = self.keys(tag, sorted(present))
        rcs = self.kv.put(keys, [self.buf.ctypes.data] * len(keys), [self.VALUE] * len(keys))
        if any(rc != 0 for rc in rcs):
            raise RuntimeError(f"bench put failed: {sorted(set(rcs))}")

    def probe(self, tag: str, objs: list[tuple[int, int]]) -> set[tuple[int, int]]:
        keys, d = self.keys(tag, objs), self.g.parallel.dcp
        t0 = time.perf_counter()
        res = self.kv.exist(keys)
        self.seconds += time.perf_counter() - t0
        return {o for k, o in enumerate(objs) if all(x == 1 for x in res[k * d:(k + 1) * d])}

    def take_seconds(self) -> float:
        out, self.seconds = self.seconds, 0.0
        return out

    def time_baseline(self, tag: str, n: int) -> float:
        """Return the seconds of vLLM's probe (impl/lookup.py: list_baseline_probes) on every rank, one call."""
        from kvspec.impl.lookup import list_baseline_probes
        keys = self.keys(tag, list_baseline_probes(self.g, n))
        t0 = time.perf_counter()
        self.kv.exist(keys)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.kv.unregister(self.buf.ctypes.data)
        self.kv.close()


def _bench_hash(tag: str, boundary: int) -> str:
    """Return a stand-in for H_t of the bench request `tag` (distinct per request and boundary)."""
    return hashlib.sha256(f"{tag}/{boundary}".encode()).hexdigest()


def bench_lookup_master(sizes: tuple[int, ...] = (131_072, 1_048_576, 4_194_304),
                        rule_sets: tuple[str, ...] = (VLLM_0_34, VLLM_0_33)) -> list[dict[str, Any]]:
    """Return bench_lookup's rows measured on a real mooncake_master started on 127.0.0.1 (stopped by PID after)."""

    from kvspec.impl.cluster import running_master
    with tempfile.TemporaryDirectory(prefix="kvspec-lbench-") as wd, running_master(wd) as m:
        return bench_lookup(sizes, rule_sets, master=m.address)


DEADLINE_MS = 1000  # vLLM 0.34.0's lookup deadline: a lookup past it answers hit 0
DEADLINE_SIZES = (32_768, 131_072, 524_288, 1_048_576, 2_097_152, 4_194_304, 8_388_608, 16_777_216)


def bench_deadline(dcps: tuple[int, ...] = (1, 8), sizes: tuple[int, ...] = DEADLINE_SIZES,
                   rules: str = VLLM_0_34) -> list[dict[str, Any]]:
    """Return, per D and prompt length (Kimi-K3's groups at that D, an identical resend), the master time of vLLM's
    lookup call pattern and of the implementation's, each against vLLM 0.34.0's 1 s lookup deadline (hit 0 past it)."""

    from kvspec.impl.cluster import running_master
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvspec-deadline-") as wd, running_master(wd) as m:
        for d in dcps:
            g = get_preset("kimi-k3-dcp8")
            g = attrs.evolve(g, parallel=attrs.evolve(g.parallel, dcp=d))
            for r in bench_lookup(sizes, (rules,), master=m.address, geometry=g):
                rows.append({"dcp": d, "tokens": r["tokens"], "rules": rules, "master_ms": r["master_ms"],
                             "baseline_master_ms": r["baseline_master_ms"], "probes": r["probes"],
                             "baseline_probes": r["baseline_probes"], "identical": r["identical"],
                             "past_deadline": r["master_ms"] > DEADLINE_MS,
                             "baseline_past_deadline": r["baseline_master_ms"] > DEADLINE_MS})
    return rows


def format_deadline(rows: list[dict[str, Any]]) -> list[str]:
    """Return the deadline table: per D and length both call patterns' master time, and where each passes 1 s."""
    lines = [f"lookup deadline ({DEADLINE_MS} ms, vLLM 0.34.0: hit 0 past it), Kimi-K3 groups, identical resend, "
             "time on a real master:"]
    for r in rows:
        lines.append(f"  D={r['dcp']:<2} N={r['tokens']:>9}: vLLM's pattern {r['baseline_master_ms']:>9} ms "
                     f"({r['baseline_probes']} keys){' PAST' if r['baseline_past_deadline'] else ''}; kvspec impl "
                     f"{r['master_ms']} ms ({r['probes']} keys){' PAST' if r['past_deadline'] else ''}")
    for d in sorted({r["dcp"] for r in rows}):
        mine = [r for r in rows if r["dcp"] == d]
        first = next((r["tokens"] for r in mine if r["baseline_past_deadline"]), None)
        ours = next((r["tokens"] for r in mine if r["past_deadline"]), None)
        top = max(r["tokens"] for r in mine)
        lines.append(f"  D={d}: vLLM's pattern passes the deadline at N={first}" if first else
                     f"  D={d}: vLLM's pattern stays under the deadline up to N={top}")
        lines[-1] += f"; kvspec's at N={ours}" if ours else f"; kvspec's stays under it up to N={top}"
    return lines


@attrs.frozen(kw_only=True)
class LayerLayout:
    """The bytes a hybrid model keeps per token and per request: MLA latents of its attention layers and the
    recurrent (Mamba / KDA) state of its linear layers. Default: a Kimi-Linear-class hybrid."""

    attention_layers: int = 7  # MLA layers
    latent: int = 576  # latent values per token per layer (512 compressed KV + 64 RoPE)
    latent_bytes: int = 2  # bf16
    state_layers: int = 20  # KDA / Mamba layers
    state_heads: int = 32
    state_head_dim: int = 128  # a state is heads x d x d
    state_bytes: int = 4  # fp32

    def compute_attention_bytes_per_token(self) -> int:
        """Return layers * latent * bytes: attention KV of one token (DCP spreads tokens, not bytes)."""
        return self.attention_layers * self.latent * self.latent_bytes

    def compute_state_bytes(self, tp: int) -> int:
        """Return one rank's recurrent state of a request: layers * heads * d^2 * bytes / TP (heads shard)."""
        return self.state_layers * self.state_heads * self.state_head_dim ** 2 * self.state_bytes // tp


def measure_memcpy_gib_s(nbytes: int = 256 << 20, repeats: int = 3) -> float:
    """Return this machine's host memcpy bandwidth (best of `repeats` tensor copies), for context."""
    import torch
    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    best = min(_time(lambda: dst.copy_(src)) for _ in range(repeats))
    return round(nbytes / best / 2**30, 2)


def _time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_transfer(dcp: int = 2, tokens: int = 16_384, repeats: int = 3, layout: LayerLayout | None = None,
                   rules: str = VLLM_0_33) -> dict[str, Any]:
    """Return store and load GiB/s of the implementation and of raw Mooncake batch calls on the same bytes.

    D rank processes (kvspec.impl.transfer_bench) over TCP to a real master on 127.0.0.1; kimi-k3-dcp8's
    block sizes at DCP D; per-token bytes from the layer layout. Per iteration the step time is the slowest
    rank's; GiB/s = bytes over all ranks / step time; ratio = raw time / ours time (>= 0.9 is the target).
    """

    from kvspec.impl.cluster import run_ranks, running_master
    from kvspec.impl.job import Job, TransferPlan

    lay = layout or LayerLayout()
    g = attrs.evolve(get_preset("kimi-k3-dcp8"), parallel=Parallel(dcp=dcp))
    per_token = lay.compute_attention_bytes_per_token()
    width, mwidth = -(-per_token // 4), -(-lay.compute_state_bytes(dcp) // 4)
    plan = TransferPlan(tokens=tokens, mamba_width=mwidth, repeats=repeats)
    with tempfile.TemporaryDirectory(prefix="kvspec-tbench-") as wd, running_master(wd) as m:
        job = Job(master=m.address, geometry=g, width=width, store_rule=compute_impl_store_rule(rules),
                  segment_bytes=1 << 30, transfer=plan)
        ranks = run_ranks(job, dcp, timeout_s=600, workdir=wd, module="kvspec.impl.transfer_bench")
    iters = list(zip(*(r["rows"] for r in ranks)))

    def step(rows: tuple[dict[str, Any], ...], phase: str, who: str) -> float:
        return float(max(r[f"{phase}_s"][who] for r in rows))

    def gib_s(phase: str, who: str) -> float:
        key = f"{phase}_bytes" if who == "ours" else f"raw_{phase}_bytes"
        return statistics.median(float(sum(r[key] for r in rows) / step(rows, phase, who) / 2**30) for rows in iters)

    def ratio(phase: str) -> float:
        return statistics.median(step(rows, phase, "raw") / step(rows, phase, "ours") for rows in iters)

    first = iters[0]
    return {"dcp": dcp, "tokens": tokens, "iterations": len(iters), "rules": rules, "device": ranks[0]["device"],
            "backend": ranks[0]["backend"], "staging": ranks[0]["staging"],
            "layout": attrs.asdict(lay), "bytes_per_token": per_token, "bytes_per_token_per_rank": per_token / dcp,
            "state_bytes_per_rank": lay.compute_state_bytes(dcp),
            "objects_per_rank": first[0]["objects"], "loads_per_rank": first[0]["loads"],
            "put_bytes": sum(r["put_bytes"] for r in first), "get_bytes": sum(r["get_bytes"] for r in first),
            "put_gib_s": {"ours": round(gib_s("put", "ours"), 3), "raw": round(gib_s("put", "raw"), 3)},
            "get_gib_s": {"ours": round(gib_s("get", "ours"), 3), "raw": round(gib_s("get", "raw"), 3)},
            "put_ratio": round(ratio("put"), 3), "get_ratio": round(ratio("get"), 3),
            "same_bytes": all(r["same_bytes"] for rows in iters for r in rows)}


EFFICIENCY_GEOMETRIES = ("kimi-k3-dcp8", "small-dcp2")


def _efficiency_geometry(name: str) -> Any:
    return get_preset(name) if name == "kimi-k3-dcp8" else make_geometry(4, [("attention", 16, True),
                                                                             ("mamba", 16, False)], dcp=2)


def compute_resend_series(name: str, retention: str, rules: str, step: int) -> list[tuple[int, int]]:
    """Return (P, h) of identical resends over one sweep: P = L+1 … 2L−2 in steps of `step` (the hit against P)."""
    g = attrs.evolve(_efficiency_geometry(name), retention=retention)
    lcm = compute_lcm_span(g)
    return [(p, int(evaluate_scenario(Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),),
                                               rules=rules)).hit_length)) for p in range(lcm + 1, 2 * lcm - 1, step)]


REUSABLE = "min(⌊S/u⌋·u, ⌊(N−1)/u⌋·u)"  # the one definition: README, the plot, the tests and the tables use it


def compute_reusable(shared: int, prompt: int, unit: int) -> int:
    """Return min(⌊S/u⌋·u, ⌊(N−1)/u⌋·u): the whole units of the shared prefix below N (the logits need the last
    token recomputed), the most any loader can reuse; a resend (S = N = P) gives ⌊(P−1)/u⌋·u."""
    return min(shared // unit * unit, (prompt - 1) // unit * unit)


def bench_efficiency(rule_sets: tuple[str, ...] = MEASURED, step: int = 7) -> list[dict[str, Any]]:
    """Return, per geometry, retention and rule set, the identical-resend hit over a sweep of prompt lengths.

    Kimi-K3 (DCP 8): P = L+1 … 2L−2 in steps of `step`, plus the 10^6-token resend; a small geometry
    (u = 4, b = 16, D = 2) over one scheduler block in steps of 1. Reusable tokens: compute_reusable (a resend:
    ⌊(P−1)/u⌋·u), the same yardstick for every rule set, so the EAGLE drop's cost shows in the ratio.
    """
    rows = []
    for name in EFFICIENCY_GEOMETRIES:
        g0 = _efficiency_geometry(name)
        u = g0.unit
        for retention in ("replay", "dense"):
            for rules in rule_sets:
                series = compute_resend_series(name, retention, rules, step if name == "kimi-k3-dcp8" else 1)
                got = sum(h for _, h in series)
                reusable = sum(compute_reusable(p, p, u) for p, _ in series)
                zero = sum(h == 0 for _, h in series)
                row = {"geometry": name, "retention": retention, "rules": rules, "prompts": len(series),
                       "zero_hits": zero, "zero_hit_fraction": round(zero / len(series), 4),
                       "reused_over_reusable": round(got / reusable, 4)}
                if name == "kimi-k3-dcp8":
                    big = 10**6
                    g = attrs.evolve(g0, retention=retention)
                    row["hit_at_1m"] = evaluate_scenario(Scenario(geometry=g, prompt=big, rules=rules,
                                                                  stored=(StoredRequest(prompt=big, shared=big),))).hit_length
                rows.append(row)
    return rows


SYSTEM_PROMPTS = (8192, 20000, 65536)  # a shared system prompt, then a distinct user turn of USER_TURN tokens
USER_TURN = 1000
SHARED_BUDGETS = (None, 2048, 8192, 32768)  # the block schedule, then max_num_batched_tokens (8192: vllm serve, H100)


def bench_shared_prompt(rule_sets: tuple[str, ...] = (VLLM_0_33, VLLM_0_34)) -> list[dict[str, Any]]:
    """Return, on kimi-k3-dcp8 per retention, rule set and system prompt length, the hit of a second request that
    shares only the system prompt with a stored one (each sys + USER_TURN tokens), per chunk budget of the stored
    prefill, and under kvspec's proposal (budget 32768, a chunk also ending at every multiple of L) with the
    scheduler steps it costs (chunks of the stored prefill)."""
    g0 = get_preset("kimi-k3-dcp8")
    lcm = compute_lcm_span(g0)
    rows = []
    for retention in ("replay", "dense"):
        g = attrs.evolve(g0, retention=retention)
        for rules in rule_sets:
            rs = get_rules(rules)
            for sys_prompt in SYSTEM_PROMPTS:
                p = sys_prompt + USER_TURN
                scheds = {str(b or "block"): Schedule(budget=b) for b in SHARED_BUDGETS}
                scheds["32768+L"] = Schedule(budget=32768, stop_every=lcm)
                hits, steps = {}, {}
                for name, sched in scheds.items():
                    sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=sys_prompt),),
                                  rules=rules, schedule=sched)
                    hits[name] = int(evaluate_scenario(sc).hit_length)
                    steps[name] = len(compute_checkpoints(sched, compute_rule_geometry(rs, g), p,
                                                          compute_lookahead(rs, g)).ends)
                rows.append({"retention": retention, "rules": rules, "system_prompt": sys_prompt, "prompt": p,
                             "reusable": compute_reusable(sys_prompt, p, g.unit), "hits": hits, "steps": steps})
    return rows


def iterate_conversations(count: int, turns: int, seed: int, scale: int) -> list[list[int]]:
    """Return each conversation's prompt lengths: turn k+1 resends turn k's prompt, its answer and a new message.

    Message and answer lengths are drawn from a fixed seed (messages 1–8 scale units, answers 1–4), so the
    trace is the same on every run.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        lengths, p = [], 0
        for _ in range(turns):
            p += rng.randint(scale, 8 * scale)  # the new user message
            lengths.append(p)
            p += rng.randint(scale // 4 or 1, scale)  # the model's answer (decoded: not stored)
        out.append(lengths)
    return out


def bench_conversations(rule_sets: tuple[str, ...] = MEASURED, count: int = 12, turns: int = 8,
                        seed: int = 2026) -> list[dict[str, Any]]:
    """Return, per geometry, retention and rule set, the hits of a multi-turn trace.

    Every turn's prompt was stored when it ran (its prefill); the next turn shares exactly that prompt with
    it. Reusable tokens of a turn: compute_reusable (its shared prefix in whole units below N), the same for
    every rule set; a turn's hit counts against that.
    """
    rows = []
    for name in EFFICIENCY_GEOMETRIES:
        for retention in ("replay", "dense"):
            g = attrs.evolve(_efficiency_geometry(name), retention=retention)
            u, scale = g.unit, compute_lcm_span(g) // 4
            for rules in rule_sets:
                n = zero = got = reusable = 0
                for conv in iterate_conversations(count, turns, seed, scale):
                    for prev, cur in zip(conv, conv[1:]):
                        h = evaluate_scenario(Scenario(geometry=g, prompt=cur, rules=rules,
                                                       stored=(StoredRequest(prompt=prev, shared=prev),))).hit_length
                        best = compute_reusable(prev, cur, u)
                        n, zero, got, reusable = n + 1, zero + (h == 0), got + h, reusable + best
                rows.append({"geometry": name, "retention": retention, "rules": rules, "turns": n,
                             "zero_hits": zero, "zero_hit_fraction": round(zero / n, 4),
                             "reused_over_reusable": round(got / reusable, 4)})
    return rows


def render_plot(path: str, rule_sets: tuple[str, ...] = MEASURED, step: int = 7) -> None:
    """Write a plot of the identical-resend hit against the prompt length, per rule set (one panel per geometry
    and retention), with the reusable length (compute_reusable; a resend: ⌊(P−1)/u⌋·u) for reference; and, per
    retention, the shared-system-prompt hit (bench_shared_prompt) over the stored prefill's chunk budget."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 2, figsize=(12, 12))
    for row, name in enumerate(EFFICIENCY_GEOMETRIES):
        u = _efficiency_geometry(name).unit
        for col, retention in enumerate(("replay", "dense")):
            ax = axes[row][col]
            series = {r: compute_resend_series(name, retention, r, step if name == "kimi-k3-dcp8" else 1)
                      for r in rule_sets}
            first = next(iter(series.values()))
            ax.plot([p for p, _ in first], [compute_reusable(p, p, u) for p, _ in first], color="0.7", lw=1,
                    label="reusable ⌊(P−1)/u⌋·u (S = N = P)")
            for r, pts in series.items():
                ax.step([p for p, _ in pts], [h for _, h in pts], where="post", lw=1.2, label=r)
            ax.set_title(f"{name}, {retention} retention: identical resend")
            ax.set_xlabel("prompt length P (tokens)")
            ax.set_ylabel("hit h (tokens)")
            ax.legend(fontsize=8)
    shared = bench_shared_prompt()
    for col, retention in enumerate(("replay", "dense")):
        ax = axes[2][col]
        for row_ in (x for x in shared if x["retention"] == retention):
            names = list(row_["hits"])
            ax.plot(range(len(names)), [row_["hits"][k] / row_["reusable"] for k in names], marker="o", lw=1.2,
                    label=f"{row_['rules']}, system {row_['system_prompt']}")
            ax.set_xticks(range(len(names)), [("budget " + k if k[0].isdigit() else k) for k in names], fontsize=8)
        ax.set_title(f"kimi-k3-dcp8, {retention}: shared system prompt, then a new turn")
        ax.set_xlabel("how the first request's prefill was scheduled (32768+L: kvspec's proposal)")
        ax.set_ylabel("second request's hit / reusable")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=7)
    fig.tight_layout()

    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix[1:].lower() or "png")
    plt.close(fig)
    write_output_file(path, buf.getvalue())


def format_bench(out: dict[str, Any]) -> str:
    """Return the readable summary of a bench run."""
    lines = []
    if "calibration" in out:
        c = out["calibration"]
        lines.append(f"machine: {c['machine']}, {c['cores']} cores, Python {c['python']}; calibration loop "
                     f"({c['loop']}) {c['loop_seconds']} s")
    if out.get("deadline"):
        lines.extend(format_deadline(out["deadline"]))
    for r in out.get("lookup", []):
        lines.append(f"lookup {r['rules']:<12} N={r['tokens']:>9}: {r['probes']} probes vs {r['baseline_probes']} "
                     f"({r['ratio']}x), {r['rounds']} rounds, identical to the spec: {r['identical']}"
                     + (f"; on the master {r['master_ms']} ms vs {r['baseline_master_ms']} ms (vLLM 0.34.0's lookup "
                        f"deadline: 1000 ms)" if "master_ms" in r else ""))
    if out.get("efficiency") or out.get("conversations"):
        lines.append(f"reusable = {REUSABLE} tokens (S shared, N looked up; a resend: ⌊(P−1)/u⌋·u)")
    for r in out.get("efficiency", []):
        lines.append(f"efficiency {r['geometry']:<13} {r['retention']:<6} {r['rules']:<21}: reused/reusable "
                     f"{r['reused_over_reusable']:.1%}, zero hits {r['zero_hits']}/{r['prompts']}"
                     + (f", 1M resend hits {r['hit_at_1m']}" if "hit_at_1m" in r else ""))
    if out.get("shared_prompt"):
        names = list(out["shared_prompt"][0]["hits"])
        lines.append(f"shared system prompt (kimi-k3-dcp8, + a {USER_TURN}-token user turn): the second request's hit "
                     f"per chunk budget of the first ({', '.join(names)}; 32768+L: kvspec's proposal), steps = chunks")
    for r in out.get("shared_prompt", []):
        cells = ", ".join(f"{r['hits'][k]}" for k in r["hits"])
        lines.append(f"shared {r['retention']:<6} {r['rules']:<12} system {r['system_prompt']:>6}: hit {cells} of "
                     f"{r['reusable']}; steps {r['steps']['32768']} -> {r['steps']['32768+L']} with the proposal")
    for r in out.get("conversations", []):
        lines.append(f"conversation {r['geometry']:<13} {r['retention']:<6} {r['rules']:<21}: reused/reusable "
                     f"{r['reused_over_reusable']:.1%}, zero hits {r['zero_hits']}/{r['turns']} turns")
    for r in out.get("load", []):
        lines.append(f"load D={r['dcp']} {r['streams']} streams {r['seconds']} s (master restarted {r['restarts']}x): "
                     f"{r['requests_per_s']} requests/s; lookup p50/p99 {r['lookup_ms']['p50']}/{r['lookup_ms']['p99']} "
                     f"ms, load {r['load_ms']['p50']}/{r['load_ms']['p99']} ms; bytes wrong {r['bytes_wrong']} of "
                     f"{r['bytes_compared']}; hangs {r['hangs']}, errors {r['errors']}")
    if "memcpy_gib_s" in out:
        lines.append(f"memcpy (this machine): {out['memcpy_gib_s']} GiB/s")
    for r in out.get("transfer", []):
        lines.append(f"transfer D={r['dcp']} N={r['tokens']} ({r['bytes_per_token']} B/token, {r['device']}"
                     f"{', staged' if r['staging'] else ''}): put {r['put_gib_s']['ours']} vs raw "
                     f"{r['put_gib_s']['raw']} GiB/s (ratio {r['put_ratio']}), get {r['get_gib_s']['ours']} vs raw "
                     f"{r['get_gib_s']['raw']} GiB/s (ratio {r['get_ratio']}), same bytes: {r['same_bytes']}")
    if "wall_seconds" in out and "calibration" in out:
        lines.append(f"kvspec bench: {format_calibrated(out['wall_seconds'], out['cpu_seconds'], out['calibration'])}")
    return "\n".join(lines)


def run_bench(quick: bool = False, transfer_only: bool = False, json_out: bool = False,
              dcps: tuple[int, ...] | None = None, tokens: int | None = None, efficiency_only: bool = False,
              plot: str | None = None, deadline_only: bool = False) -> int:
    """Run the benches, print the summary (or the JSON object) with this machine's calibration and the run's own wall
    and CPU time (its children's included: the masters and rank processes it waited for); return 0."""
    out: dict[str, Any] = {"calibration": measure_calibration()}
    t0, c0 = time.perf_counter(), measure_cpu_seconds()

    def finish() -> int:
        out["wall_seconds"] = round(time.perf_counter() - t0, 2)
        out["cpu_seconds"] = round(measure_cpu_seconds() - c0, 2)
        print(json.dumps(out, indent=2) if json_out else format_bench(out))
        return 0

    if deadline_only:
        out["deadline"] = bench_deadline()
        return finish()
    if not transfer_only:
        out["efficiency"] = bench_efficiency(step=49 if quick else 7)
        out["conversations"] = bench_conversations(count=4 if quick else 12)
        out["shared_prompt"] = bench_shared_prompt()
    if plot:
        try:
            render_plot(plot, step=49 if quick else 7)
        except (OSError, ValueError) as exc:
            raise SpecError("output-file", f"cannot write the plot {plot}: {exc}") from None
        out["plot"] = plot
    if efficiency_only:
        return finish()
    import torch
    out["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if not transfer_only:
        out["lookup"] = bench_lookup_master((131_072, 1_048_576) if quick else (131_072, 1_048_576, 4_194_304))
        out["deadline"] = bench_deadline(sizes=DEADLINE_SIZES[:4] if quick else DEADLINE_SIZES)
    if not transfer_only:
        out["load"] = [run_load(dcp=d, streams=16, seconds=15 if quick else 30) for d in (2, 4)]
    out["memcpy_gib_s"] = measure_memcpy_gib_s()
    out["transfer"] = [bench_transfer(dcp=d, tokens=tokens or (16_384 if quick else 32_768),
                                      repeats=2 if quick else 3) for d in (dcps or ((2,) if quick else (2, 4)))]
    return finish()
