"""SGLang 0.5.23's own hit rule as the oracle of `sglang-0.5.23` (issue 32; a first step of `kvspec conform sglang`).

Run: `python -m kvspec.checks.sglang_oracle --root DIR [--count N] [--seed S]`, DIR the unpacked `sglang==0.5.23`
wheel (`pip download sglang==0.5.23 --no-deps`, then unzip). Per generated scenario (MLA, DCP 1–8, an optional
KDA/Mamba pool on its grid, 1–3 stored requests sharing prefixes with the lookup, single-shard evictions, EAGLE bigram
keys without Mamba at DCP 1): every rank's objects are the keys kvspec's store rule and key grammar name (page hashes
from kvspec's statement of SGLang's hash, checked against SGLang's C++ separately); SGLang's own
`MooncakeStore.batch_exists_v2` answers each rank's restorable prefixes over a store stand-in; the hit is compared
with kvspec's.

What is SGLang's code here and what is not (the shims):
* imported from the wheel: `hicache_storage` (PoolName, PoolTransfer, PoolHitPolicy, PoolTransferResult) and
  `MooncakeStore` with its methods `batch_exists_v2`, `batch_exists`, `_get_hybrid_page_component_keys`,
  `_tag_keys`, `_batch_exist`;
* stub modules for imports the hit rule never calls (`sglang.srt.environ`, the host-pool and linker classes, the
  metrics collector) and empty packages instead of the package `__init__`s (they import the whole server);
* the store object is made with `object.__new__` (its `__init__` connects to a master): its key prefix and suffixes
  are set as kvspec's `render_key_sglang` states them, `store.batch_is_exist` answers from the rank's key set;
* the cross-rank step — SGLang's `_sync_prefetch_hit_query` MIN-reduces one flag per prefix length — is done here as
  that function states it (the intersection of every rank's restorable prefixes, then its maximum): driving that
  function itself is the next step.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import SglangKey, compute_sglang_page_hashes, render_key_sglang
from kvspec.spec.rules import compute_lookahead, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.store import compute_rule_store
from kvspec.spec.types import Rank, Tokens

RULES = "sglang-0.5.23"
MODEL = "kvspec/oracle"
PACKAGES = ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.storage",
            "sglang.srt.mem_cache.storage.mooncake_store")


def load_sglang(root: str) -> tuple[Any, Any]:
    """Return (hicache_storage, mooncake_store) imported from an unpacked sglang 0.5.23 wheel, with the stubs above."""
    for name in PACKAGES:  # empty packages: the real __init__s import the whole server
        mod = types.ModuleType(name)
        mod.__path__ = [str(Path(root, *name.split(".")))]
        sys.modules[name] = mod

    def stub(name: str, **attrs: Any) -> None:
        mod = types.ModuleType(name)
        mod.__path__ = []
        mod.__dict__.update(attrs)
        sys.modules[name] = mod

    class _Env:
        def __getattr__(self, key: str) -> Any:
            return types.SimpleNamespace(is_set=lambda: False, get=lambda: None, default=None, name=key)

    stub("sglang.srt.environ", envs=_Env())
    stub("sglang.srt.mem_cache.hybrid_cache")
    stub("sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler", DevicePoolEntry=type("DevicePoolEntry", (), {}))
    stub("sglang.srt.mem_cache.pool_host", HostKVCache=type("HostKVCache", (), {}),
         HostTensorAllocator=type("HostTensorAllocator", (), {}))
    stub("sglang.srt.mem_cache.pool_host.mla", MLATokenToKVPoolHost=type("MLATokenToKVPoolHost", (), {}))
    stub("sglang.srt.observability")
    stub("sglang.srt.observability.metrics_collector", StorageMetrics=type("StorageMetrics", (), {}))
    return (importlib.import_module("sglang.srt.mem_cache.hicache_storage"),
            importlib.import_module("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store"))


class FakeStore:
    """One rank's Mooncake stand-in: the keys it holds."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        """Return 1 per key present, 0 otherwise (Mooncake's batch_is_exist)."""
        return [1 if k in self.keys else 0 for k in keys]


def _key(g: Geometry, rank: int, page_hash: str, pool: str, conv: int = 0) -> str:
    page = g.groups[0].block_size * g.parallel.dcp
    return render_key_sglang(SglangKey(page_hash=page_hash, pool=pool, model=MODEL, tp_size=g.parallel.dcp,
                                       tp_rank=rank, dcp_size=g.parallel.dcp, dcp_rank=rank, page=page, conv=conv))


def make_rank_store(ms: Any, hs: Any, g: Geometry, rank: int, fake: FakeStore) -> Any:
    """Return SGLang's MooncakeStore for one rank without its __init__ (prefix and suffixes as kvspec states them)."""
    store = object.__new__(ms.MooncakeStore)
    # PREFIX_00_SUFFIX: kvspec's renderings split into the attributes SGLang's __init__ would set
    mla, mha = _key(g, rank, "00", "mla-k"), _key(g, rank, "00", "mamba-temporal")
    store.config_prefix = mla[: mla.index("_00_")]
    store.mla_suffix = mla[mla.index("_00_") + 4: -len("_k")]
    store.mha_suffix = mha[mha.index("_00_") + 4: -len("_temporal")]
    store.is_mla_backend = True
    store.should_split_heads = False
    store.mem_pool_host = types.SimpleNamespace(kv_buffer=object())
    mamba_host = types.SimpleNamespace(conv_buffer=[object()], temporal_state_elem_size=1)
    store.registered_pools = {hs.PoolName.MAMBA: mamba_host}
    store.store = fake
    return store


def compute_sglang_hit(hs: Any, ms: Any, sc: Scenario, tokens: list[int], writers: list[list[int]],
                       evicted: list[tuple[int, int, int]]) -> int:
    """Return the hit (tokens) SGLang's batch_exists_v2 gives on every rank's store, intersected across ranks."""
    g = sc.geometry
    d, page = g.parallel.dcp, g.groups[0].block_size * g.parallel.dcp
    rules = get_rules(RULES)
    lam = compute_lookahead(rules, g)
    mamba = [i for i, gr in enumerate(g.groups) if gr.kind == "mamba"]
    fakes = [FakeStore() for _ in range(d)]
    gone = {(gi, t, r) for gi, t, r in evicted}
    for toks in writers:  # each writer puts its pages' MLA shard and its Mamba state's components on every rank
        hashes = compute_sglang_page_hashes(toks, page, bigram=lam > 0)
        for gi, t in compute_rule_store(rules, g, Tokens(len(toks))):
            for r in range(d):
                if (gi, t, r) in gone:
                    continue
                h = hashes[t // page - 1]
                pools = ("mla-k",) if g.groups[gi].kind == "attention" else ("mamba-temporal", "mamba-conv")
                fakes[r].keys.update(_key(g, r, h, p) for p in pools)
    bound = (len(tokens) - 1) // page  # _compute_max_prefix_len: N − 1, page-floored
    keys = compute_sglang_page_hashes(tokens[: bound * page + lam], page, bigram=lam > 0)[:bound]
    if not keys:
        return 0
    transfers = [hs.PoolTransfer(name=hs.PoolName.MAMBA, keys=["placeholder"], hit_policy=hs.PoolHitPolicy.TRAILING_PAGES)
                 for _ in mamba]
    common: set[int] | None = None
    for r in range(d):
        res = make_rank_store(ms, hs, g, r, fakes[r]).batch_exists_v2(keys, transfers)
        got = set(res.restorable_prefix_pages or [])
        common = got if common is None else common & got
    return max(common or {0}) * page


def iterate_cases(rng: random.Random, count: int) -> Iterator[tuple[Scenario, list[int], list[list[int]]]]:
    """Yield generated scenarios with the lookup's tokens and each writer's tokens."""
    made = 0
    while made < count:
        d = rng.choice([1, 1, 2, 4, 8])
        b = rng.choice([1, 2, 4])
        page = b * d
        hybrid = rng.random() < 0.75
        eagle = not hybrid and d == 1 and rng.random() < 0.5
        groups = [Group(kind="attention", block_size=b, eagle=eagle)]
        if hybrid:
            groups.append(Group(kind="mamba", block_size=page * rng.choice([1, 2, 3])))
        g = Geometry(unit=b, groups=tuple(groups), parallel=Parallel(dcp=d), retention="replay")
        n = rng.randint(1, 8 * page + 3)
        base = [rng.randrange(1, 1 << 17) for _ in range(n)]
        stored = []
        writers = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            p = rng.randint(1, 8 * page + 3)
            s = rng.randint(0, min(p, n))
            own = [rng.randrange(1, 1 << 17) for _ in range(p - s)]
            if own and s < n and own[0] == base[s]:
                own[0] += 1
            stored.append(StoredRequest(prompt=p, shared=s))
            writers.append(base[:s] + own)
        sc = Scenario(geometry=g, prompt=n, stored=tuple(stored), rules=RULES)
        objs = sorted(evaluate_scenario(sc).present)
        if objs and rng.random() < 0.3:
            gi, t = rng.choice(objs)
            sc = Scenario(geometry=g, prompt=n, stored=tuple(stored), rules=RULES,
                          evicted=frozenset({(gi, t, Rank(rng.randrange(d)))}))
        made += 1
        yield sc, base, writers


def run_oracle(root: str, count: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Return the comparison of kvspec's sglang-0.5.23 hit with SGLang's own, on `count` generated scenarios."""
    hs, ms = load_sglang(root)
    rng = random.Random(seed)
    n = agree = 0
    first: list[str] = []
    for sc, base, writers in iterate_cases(rng, count):
        want = evaluate_scenario(sc).hit_length
        got = compute_sglang_hit(hs, ms, sc, base, writers, sorted(sc.evicted))
        n += 1
        agree += want == got
        if want != got and len(first) < 5:
            first.append(f"kvspec {want} SGLang {got}: {sc}")
    return {"compared": n, "agree": agree, "disagreements": first}


def main(argv: list[str] | None = None) -> int:
    """Run the oracle comparison and print the report as JSON; exit 1 on a disagreement."""
    p = argparse.ArgumentParser(prog="python -m kvspec.checks.sglang_oracle")
    p.add_argument("--root", required=True, help="the unpacked sglang==0.5.23 wheel")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rep = run_oracle(args.root, args.count, args.seed)
    print(json.dumps(rep, indent=1))
    return 0 if rep["agree"] == rep["compared"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
