"""SGLang 0.5.23's own code as the oracle of `sglang-0.5.23` (issue 32): `kvspec conform sglang`.

Per generated scenario (MLA, DCP 1–8, an optional KDA/Mamba pool on its grid, 1–3 stored requests sharing prefixes
with the lookup, single-shard evictions, EAGLE bigram keys without Mamba at DCP 1) every rank runs SGLang's code from
the wheel (checks/conform/sglang_code.py says which, and what the shims are):
* **store**: each writer's radix nodes are backed up as SGLang's `write_backup_storage` hands them to the controller —
  page hashes by SGLang's `get_storage_hash_str` over its `RadixKey` (bigram where the tree is EAGLE), the Mamba
  transfer by `MambaComponent.build_hicache_transfers(BACKUP_STORAGE)`, the write by
  `HybridCacheController._page_backup_with_stable_layout` → `_page_backup` → `MooncakeStore.batch_set_v1` /
  `batch_set_v2`, into each rank's store stand-in, under the key prefix and suffixes SGLang's own
  `MooncakeStore.__init__` derives from a `HiCacheStorageConfig`;
* **hit**: the prefetch thread's two steps, `_storage_hit_query` (hashes, `batch_exists_v2`) and
  `_sync_prefetch_hit_query` (one restorable flag per prefix length, MIN-reduced over the ranks) on D threads;
* **load**: `MooncakeStore.batch_get_v1` for the hit's pages and `batch_get_v2` for the Mamba state at the trailing
  page, the keys each rank asks for recorded.

Compared per field with kvspec: the keys every rank holds (kvspec's objects rendered by `render_key_sglang`), the
hit, and the keys every rank loads (kvspec's load plan rendered). The radix tree itself is not driven: where a
writer's nodes end and which one carries a Mamba value is kvspec's store rule (spec/store.py), and the prefetch's
token range is the scheduler's N − 1, page-floored (`_compute_max_prefix_len`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import time
import types
from array import array
from collections.abc import Iterator
from typing import Any

import attrs

from kvspec.checks.conform.sglang_code import SGLANG_CODE, SHIMS, load_sglang, run_ranks
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import SglangKey, compute_sglang_page_hashes, render_key_sglang
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import SGLANG_0_5_23, compute_lookahead, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.store import compute_rule_store
from kvspec.spec.types import Boundary, GroupId, Rank, Tokens

RULES = SGLANG_0_5_23
MODEL = "kvspec/oracle"
FIELDS = ("stored", "hit", "loaded")


class FakeClient:
    """One rank's Mooncake client stand-in: the keys it holds, and the keys asked for."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.got: list[str] = []

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Return 0 (connected)."""
        return 0

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        """Return 1 per key present, 0 otherwise."""
        return [1 if k in self.keys else 0 for k in keys]

    def batch_put_from(self, keys: list[str], ptrs: list[Any], sizes: list[Any], config: Any = None) -> list[int]:
        """Store the keys; return 0 per key (stored)."""
        self.keys.update(keys)
        return [0] * len(keys)

    batch_put_from_multi_buffers = batch_put_from

    def batch_get_into(self, keys: list[str], ptrs: list[Any], sizes: list[Any]) -> list[int]:
        """Record the keys asked for; return bytes read (1) per present key, Mooncake's -704 per missing one."""
        self.got.extend(keys)
        return [1 if k in self.keys else -704 for k in keys]

    batch_get_into_multi_buffers = batch_get_into


class HostPool:
    """A host pool stand-in: its page size and one buffer address per stored object of each page."""

    def __init__(self, page_size: int, objects_per_page: int, **attrs_: Any) -> None:
        self.page_size = page_size
        self.objects = objects_per_page
        self.kv_buffer = object()
        self.__dict__.update(attrs_)

    def get_page_buffer_meta(self, indices: Any) -> tuple[list[int], list[int]]:
        """Return (addresses, sizes): one per object of every page the indices cover."""
        n = len(indices) // self.page_size * self.objects
        return list(range(1, n + 1)), [1] * n


def make_rank(code: Any, g: Geometry, rank: int) -> tuple[Any, Any, FakeClient]:
    """Return (SGLang's MooncakeStore, its HybridCacheController, the client) of one DCP rank, the store made by
    SGLang's own __init__ from a HiCacheStorageConfig (its connection and warm-up stubbed)."""
    d, page = g.parallel.dcp, g.groups[0].block_size * g.parallel.dcp
    hs, ms = code.hs, code.ms
    client = FakeClient()

    def load_config(self: Any, storage_config: Any) -> Any:
        return types.SimpleNamespace(global_segment_size=1 << 30, device_name="", standalone_storage=False,
                                     check_server=False, enable_ssd_offload=False, ssd_offload_path=None,
                                     tenant_id=ms.DEFAULT_TENANT_ID, local_hostname="127.0.0.1",
                                     metadata_server="P2PHANDSHAKE", protocol="tcp",
                                     master_server_address="127.0.0.1:0")

    # SGLang's MooncakeStore with only its connection stubbed: the client, no group semantics or session ids, a
    # config without a file, no warm-up round trip
    store_cls = type("Store", (ms.MooncakeStore,), {
        "_import_mooncake_store": lambda self: (lambda: client),
        "_import_mooncake_group_semantics": lambda self: (None, False),
        "_replicate_config_supports": lambda self, name: False,
        "_load_config": load_config, "warmup": lambda self: None})

    config = hs.HiCacheStorageConfig(tp_rank=rank, tp_size=d, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                     is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
                                     model_name=MODEL, dcp_size=d, dcp_rank=rank, logical_page_size=page)
    store = store_cls(config, None)
    store.mem_pool_host = HostPool(page, 1)  # one address per logical page (the layout is not what is compared)
    store.registered_pools = {hs.PoolName.MAMBA: HostPool(1, 2, conv_buffer=[object()], temporal_state_elem_size=1)}
    ctl = object.__new__(code.Controller)
    ctl.page_size, ctl.storage_backend, ctl.storage_config = page, store, config
    ctl.storage_backend_type, ctl.page_set_func = "mooncake", ctl._page_set_zero_copy
    ctl.prefetch_hits_sync_groups = [None]
    return store, ctl, client


def _radix_key(code: Any, tokens: list[int], pages: int, page: int, bigram: bool) -> Any:
    """Return SGLang's RadixKey of `pages` whole pages of tokens (bigram: one raw token more, as the tree holds it)."""
    raw = array("q", tokens[: pages * page + (1 if bigram else 0)])
    return code.RadixKey(raw, is_bigram=bigram).page_aligned(page)


def _backup(code: Any, ctls: list[Any], g: Geometry, tokens: list[int], bigram: bool) -> None:
    """Back up one writer's radix nodes on every rank, as write_backup_storage hands them to the controller."""
    rules = get_rules(RULES)
    page = g.groups[0].block_size * g.parallel.dcp
    objs = compute_rule_store(rules, g, Tokens(len(tokens)))
    kv_end = max((t for gi, t in objs if g.groups[gi].kind == "attention"), default=0)
    states = sorted({t for gi, t in objs if g.groups[gi].kind == "mamba"})
    cuts = sorted({c for c in (*states, kv_end) if c})  # a node ends at each state and at the last whole page
    start, last_hash = 0, None
    comp = object.__new__(code.MambaComponent)
    comp.component_type = "mamba"
    for end in cuts:
        key = _radix_key(code, tokens[start:], (end - start) // page, page, bigram)
        hashes = code.get_storage_hash_str(key, last_hash, page_size=page)
        node = types.SimpleNamespace(hash_value=hashes, component_data={"mamba": types.SimpleNamespace(
            host_value=code.torch.tensor([0]) if end in states else None)})
        xfers = code.MambaComponent.build_hicache_transfers(comp, node, code.Phase.BACKUP_STORAGE) if states else None
        for ctl in ctls:
            op = types.SimpleNamespace(host_indices=code.torch.arange(len(hashes) * page), hash_value=list(hashes),
                                       prefix_keys=None, pool_transfers=[_copy_transfer(x) for x in xfers or []] or None,
                                       pool_storage_result=code.hs.PoolTransferResult.empty(), completed_tokens=0)
            ctl._page_backup_with_stable_layout(op)
            if op.completed_tokens != len(hashes) * page:
                raise AssertionError(f"SGLang's backup wrote {op.completed_tokens} of {len(hashes) * page} tokens")
        start, last_hash = end, hashes[-1]


def _copy_transfer(transfer: Any) -> Any:
    """Return a copy of a PoolTransfer (each rank's operation gets its own, as each rank builds its own)."""
    return dataclasses.replace(transfer)


def _kv_key(g: Geometry, rank: int, page_hash: str, pool: str, conv: int = 0) -> str:
    page = g.groups[0].block_size * g.parallel.dcp
    return render_key_sglang(SglangKey(page_hash=page_hash, pool=pool, model=MODEL, tp_size=g.parallel.dcp,
                                       tp_rank=rank, dcp_size=g.parallel.dcp, dcp_rank=rank, page=page, conv=conv))


def _object_keys(g: Geometry, rank: int, group: int, page_hash: str) -> list[str]:
    """Return the keys kvspec's grammar gives one object (group, page) on one rank."""
    if g.groups[group].kind == "attention":
        return [_kv_key(g, rank, page_hash, "mla-k")]
    return [_kv_key(g, rank, page_hash, "mamba-temporal"), _kv_key(g, rank, page_hash, "mamba-conv")]


@attrs.frozen
class Run:
    """What SGLang's code did on one scenario: each rank's keys, the hit, each rank's loaded keys."""

    stored: tuple[frozenset[str], ...]
    hit: int
    loaded: tuple[tuple[str, ...], ...]


def _page_hashes(code: Any, tokens: list[int], page: int, bigram: bool) -> list[str]:
    """Return SGLang's page hashes of every whole page of the tokens (get_storage_hash_str over its RadixKey)."""
    pages = (len(tokens) - (1 if bigram else 0)) // page
    return list(code.get_storage_hash_str(_radix_key(code, tokens, pages, page, bigram), None, page_size=page))


def _query_ranks(code: Any, ranks: list[Any], g: Geometry, tokens: list[int],
                 bigram: bool) -> tuple[int, tuple[tuple[str, ...], ...]]:
    """Return (the hit, each rank's loaded keys) of SGLang's prefetch on every rank: _storage_hit_query, then
    _sync_prefetch_hit_query over the ranks' threads, then batch_get_v1 for the hit's pages and batch_get_v2 for the
    Mamba state at the trailing page."""
    d, page = g.parallel.dcp, g.groups[0].block_size * g.parallel.dcp
    bound = (len(tokens) - 1) // page  # the scheduler's bound: N − 1, page-floored
    if bound == 0:  # no whole page to ask for: SGLang creates no prefetch operation (below its threshold)
        return 0, ((),) * d
    mamba = any(gr.kind == "mamba" for gr in g.groups)
    comp = object.__new__(code.MambaComponent)
    comp.component_type = "mamba"

    def query(r: int, coll: Any) -> tuple[int, list[str]]:
        store, ctl, client = ranks[r]
        ctl._all_reduce = lambda tensor, op, groups: coll.all_reduce(r, tensor, op)
        xfers = code.MambaComponent.build_hicache_transfers(comp, None, code.Phase.PREFETCH, staging_tokens=1) \
            if mamba else None
        op = types.SimpleNamespace(token_ids=_radix_key(code, tokens, bound, page, bigram), last_hash=None,
                                   prefix_keys=None, assume_stored=False, pool_transfers=xfers,
                                   pool_storage_result=code.hs.PoolTransferResult.empty(), all_hash_values=None,
                                   query_pool_hit_pages=None)
        _, count = ctl._storage_hit_query(op)
        hit = ctl._sync_prefetch_hit_query(op, count)
        pages = hit // page
        client.got.clear()
        if pages:
            store.batch_get_v1(op.all_hash_values[:pages], code.torch.arange(pages * page))
            if mamba:
                store.batch_get_v2([code.hs.PoolTransfer(name=code.hs.PoolName.MAMBA, host_indices=code.torch.arange(1),
                                                         keys=[op.all_hash_values[pages - 1]],
                                                         hit_policy=code.hs.PoolHitPolicy.TRAILING_PAGES)])
        return hit, list(client.got)

    out = run_ranks(d, query)
    hits = {h for h, _ in out}
    if len(hits) != 1:
        raise AssertionError(f"the ranks disagree on the hit after the collective: {sorted(hits)}")
    return hits.pop(), tuple(tuple(k) for _, k in out)


def _is_mamba_key(key: str) -> bool:
    """Return whether SGLang wrote the key for the Mamba pool (its temporal or conv objects)."""
    return "_temporal" in key or "_conv_" in key


def run_sglang(code: Any, sc: Scenario, tokens: list[int], writers: list[list[int]]) -> Run:
    """Return what SGLang's code stores, hits and loads for one scenario on every rank."""
    g = sc.geometry
    d, page = g.parallel.dcp, g.groups[0].block_size * g.parallel.dcp
    bigram = compute_lookahead(get_rules(RULES), g) > 0
    ranks = [make_rank(code, g, r) for r in range(d)]
    ctls = [c for _, c, _ in ranks]
    for toks in writers:
        _backup(code, ctls, g, toks, bigram)
    lookup_hashes = _page_hashes(code, tokens, page, bigram)
    for gi, t, r in sorted(sc.evicted):  # the reader's object at (group, t) gone from rank r: the keys SGLang wrote
        h, client = f"_{lookup_hashes[t // page - 1]}_", ranks[r][2]  # for that page and pool (by their suffix)
        client.keys -= {k for k in client.keys if h in k and _is_mamba_key(k) == (g.groups[gi].kind == "mamba")}
    stored = tuple(frozenset(c.keys) for _, _, c in ranks)
    hit, loaded = _query_ranks(code, ranks, g, tokens, bigram)
    return Run(stored=stored, hit=hit, loaded=loaded)


class SglangAdapter:
    """SGLang 0.5.23's own code under the adapter protocol (docs/porting.md), for `kvspec conform --adapter
    kvspec.checks.conform.sglang_oracle:SGLANG --rules sglang-0.5.23`: a port of the kit to a second engine, written from the
    porting guide. The request's tokens are 1..n (the protocol is about boundaries; any tokens give equal hashes for
    equal prefixes). Per call, fresh rank stores:

    * store_objects: SGLang's backup of one request's radix nodes on every rank (as `conform sglang` drives it; the
      node shapes are kvspec's store rule, so this checks the key path: every page and state written, read back as
      (group, boundary) through SGLang's page hashes);
    * lookup: each object of E written on every rank under the keys SGLang's MooncakeStore builds for it
      (`_get_mla_buffer_meta`, `_get_hybrid_page_component_keys`, `_tag_keys`), then SGLang's prefetch query and
      collective on D threads; every group's tail is the hit (whole pages);
    * load_plan: the keys SGLang's batch_get_v1 / batch_get_v2 ask for after that query, as (group, block, key
      boundary) — attention block i of the page span keyed (i + 1)·page, the Mamba state keyed at the hit.

    Claims: one attention group (SGLang's L3 stores one MLA KV pool and the Mamba/KDA state; the draft pool of a
    DCP-1 EAGLE model is not driven here) and at most one Mamba block size.
    """

    name = "sglang-0.5.23 (SGLang's own code)"
    claims = {"drafter": ["none", "eagle"], "mix": ["A", "A+M"], "writer": ["prefill"]}  # kvspec states SGLang's prefill

    def __init__(self, root: str | None = None) -> None:
        self.root = root
        self._code: Any = None

    def _setup(self, g: Geometry, rules: str) -> tuple[Any, int, bool]:
        if get_rules(rules).store != get_rules(RULES).store:
            raise SpecError("adapter-rules", f"SGLang's own code answers for {RULES} only, not {rules}")
        if self._code is None:
            self._code = load_sglang(self.root or os.environ.get("KVSPEC_SGLANG_ROOT") or ".cache/sglang-0.5.23")
        return self._code, g.groups[0].block_size * g.parallel.dcp, compute_lookahead(get_rules(rules), g) > 0

    def store_objects(self, geometry: Geometry, prompt: int, rules: str) -> list[tuple[int, int]]:
        """Return the (group, boundary) objects SGLang's backup writes on every rank for one request."""
        code, page, bigram = self._setup(geometry, rules)
        tokens = list(range(1, prompt + 1))
        ranks = [make_rank(code, geometry, r) for r in range(geometry.parallel.dcp)]
        _backup(code, [c for _, c, _ in ranks], geometry, tokens, bigram)
        at = {h: (k + 1) * page for k, h in enumerate(_page_hashes(code, tokens, page, bigram))}
        att = next(i for i, gr in enumerate(geometry.groups) if gr.kind == "attention")
        mam = [i for i, gr in enumerate(geometry.groups) if gr.kind == "mamba"]
        objs: set[tuple[int, int]] = set()
        for _, _, client in ranks:
            for key in client.keys:
                t = next(t for h, t in at.items() if f"_{h}_" in key or key.startswith(f"{h}_"))
                objs.add((mam[0], t) if _is_mamba_key(key) else (att, t))
        return sorted(objs)

    def _ranks_with(self, code: Any, g: Geometry, present: frozenset[tuple[int, int]], tokens: list[int],
                    page: int, bigram: bool) -> list[Any]:
        hashes = _page_hashes(code, tokens, page, bigram)
        ranks = [make_rank(code, g, r) for r in range(g.parallel.dcp)]
        for store, _, client in ranks:
            for gi, t in present:
                if t % page or t // page > len(hashes):
                    continue  # not a page boundary of this request: no key SGLang would ask for
                h = hashes[t // page - 1]
                if g.groups[gi].kind == "attention":
                    keys = store._get_mla_buffer_meta([h], code.torch.arange(page))[0]
                else:
                    keys = store._get_hybrid_page_component_keys(
                        [h], code.hs.PoolTransfer(name=code.hs.PoolName.MAMBA, keys=[h]))[0]
                client.keys.update(store._tag_keys(keys))
        return ranks

    def lookup(self, geometry: Geometry, present: frozenset[tuple[int, int]], prompt: int,
               rules: str) -> tuple[int, dict[int, int]]:
        """Return SGLang's hit for E on every rank, and each group's tail (the hit: whole pages)."""
        code, page, bigram = self._setup(geometry, rules)
        tokens = list(range(1, prompt + 1))
        hit, _ = _query_ranks(code, self._ranks_with(code, geometry, present, tokens, page, bigram), geometry, tokens,
                              bigram)
        return hit, (dict.fromkeys(range(len(geometry.groups)), hit) if hit else {})

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int], present: frozenset[tuple[int, int]],
                  rules: str) -> list[tuple[int, int, int]]:
        """Return (group, block, key boundary) of every object SGLang's loads ask for after the query."""
        code, page, bigram = self._setup(geometry, rules)
        tokens = list(range(1, hit + 2))  # SGLang loads right after its query: asked again for the hit's pages
        got, loaded = _query_ranks(code, self._ranks_with(code, geometry, present, tokens, page, bigram), geometry,
                                   tokens, bigram)
        if got != hit:
            raise AssertionError(f"SGLang's query of the hit's own pages gives {got}, not {hit}")
        at = {h: (k + 1) * page for k, h in enumerate(_page_hashes(code, tokens, page, bigram))}
        plan = set()
        for keys in loaded:
            for key in keys:
                t = next(t for h, t in at.items() if f"_{h}_" in key or key.startswith(f"{h}_"))
                gi = next(i for i, gr in enumerate(geometry.groups)
                          if (gr.kind == "mamba") == _is_mamba_key(key))
                span = page if geometry.groups[gi].kind == "attention" else geometry.groups[gi].block_size
                plan.add((gi, t // span - 1, t))
        return sorted(plan)


SGLANG = SglangAdapter()


def compute_expected(sc: Scenario, tokens: list[int], writers: list[list[int]]) -> Run:
    """Return what kvspec's sglang-0.5.23 says: each rank's keys, the hit, each rank's loaded keys."""
    g = sc.geometry
    d, page = g.parallel.dcp, g.groups[0].block_size * g.parallel.dcp
    rules = get_rules(RULES)
    bigram = compute_lookahead(rules, g) > 0
    stored: list[set[str]] = [set() for _ in range(d)]
    lookup_hashes = compute_sglang_page_hashes(tokens, page, bigram=bigram)
    gone = {(gi, lookup_hashes[t // page - 1], r) for gi, t, r in sc.evicted}
    for toks in writers:
        hashes = compute_sglang_page_hashes(toks, page, bigram=bigram)
        for gi, t in compute_rule_store(rules, g, Tokens(len(toks))):
            for r in range(d):
                if (gi, hashes[t // page - 1], r) not in gone:
                    stored[r].update(_object_keys(g, r, gi, hashes[t // page - 1]))
    out = evaluate_scenario(sc)
    loaded = []
    for r in range(d):
        keys = [k for e in out.load if g.groups[e.group].kind == "attention"
                for k in _object_keys(g, r, e.group, lookup_hashes[e.key_boundary // page - 1])]
        keys += [k for e in out.load if g.groups[e.group].kind == "mamba"
                 for k in _object_keys(g, r, e.group, lookup_hashes[e.key_boundary // page - 1])]
        loaded.append(tuple(keys))
    return Run(stored=tuple(frozenset(s) for s in stored), hit=int(out.hit_length), loaded=tuple(loaded))


def iterate_kimi_cases(rng: random.Random) -> Iterator[tuple[Scenario, list[int], list[list[int]]]]:
    """Yield the Kimi-like worked cases (preset kimi-k3-sglang-dcp8: MLA pages of 1024 at DCP 8, KDA on a 4096 grid):
    a resend, a longer lookup sharing 20,000 tokens, two writers, and a page lost on one rank."""
    g = get_preset("kimi-k3-sglang-dcp8")
    base = [rng.randrange(1, 1 << 17) for _ in range(40000)]

    def writer(p: int, s: int) -> list[int]:
        return base[:s] + [t + 1 for t in base[s:p]]

    for n, reqs, evicted in ((30000, ((30000, 30000),), ()), (40000, ((30000, 20000),), ()),
                             (40000, ((20480, 20480), (30000, 25000)), ()), (30000, ((30000, 30000),), ((0, 5120, 7),))):
        sc = Scenario(geometry=g, prompt=n, stored=tuple(StoredRequest(prompt=p, shared=s) for p, s in reqs),
                      rules=RULES, evicted=frozenset((GroupId(gi), Boundary(t), Rank(r)) for gi, t, r in evicted))
        yield sc, base[:n], [writer(p, s) for p, s in reqs]


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


def compare_runs(want: Run, got: Run) -> list[str]:
    """Return the fields on which SGLang's run differs from kvspec's (each with its first difference)."""
    diffs = []
    for r, (w, x) in enumerate(zip(want.stored, got.stored, strict=True)):
        if w != x:
            diffs.append(f"stored rank {r}: kvspec only {sorted(w - x)[:2]}, SGLang only {sorted(x - w)[:2]}")
            break
    if want.hit != got.hit:
        diffs.append(f"hit: kvspec {want.hit}, SGLang {got.hit}")
    for r, (lw, lx) in enumerate(zip(want.loaded, got.loaded, strict=True)):
        if sorted(lw) != sorted(lx):
            diffs.append(f"loaded rank {r}: kvspec {list(lw)[:2]}…, SGLang {list(lx)[:2]}…")
            break
    return diffs


def run_oracle(root: str, count: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Return the comparison of kvspec's sglang-0.5.23 with SGLang's own code on the Kimi-like worked cases and
    `count` generated scenarios."""
    start = time.perf_counter()
    code = load_sglang(root)
    rng = random.Random(seed)
    n = 0
    agree = dict.fromkeys(FIELDS, 0)
    first: list[dict[str, Any]] = []
    for sc, base, writers in itertools.chain(iterate_kimi_cases(rng), iterate_cases(rng, count)):
        want, got = compute_expected(sc, base, writers), run_sglang(code, sc, base, writers)
        n += 1
        diffs = compare_runs(want, got)
        for f in FIELDS:
            agree[f] += not any(x.startswith(f) for x in diffs)
        if diffs and len(first) < 5:
            first.append({"scenario": str(sc), "differences": diffs})
    return {"engine": "sglang==0.5.23", "rules": RULES, "compared": n, "agree": agree,
            "ok": all(v == n for v in agree.values()), "disagreements": first, "sglang_code": list(SGLANG_CODE),
            "shims": list(SHIMS), "seconds": round(time.perf_counter() - start, 2)}


def format_report(rep: dict[str, Any]) -> str:
    """Return the report as text: per field agreement, the first disagreements, SGLang's code and the shims."""
    n = rep["compared"]
    lines = [f"kvspec conform sglang: rule set {rep['rules']} against {rep['engine']}'s own code, {n} scenarios "
             f"({rep['seconds']} s)"]
    lines += [f"  {f:7s} {a}/{n} agree" for f, a in rep["agree"].items()]
    for d in rep["disagreements"]:
        lines += [f"  DIFFERS: {d['scenario']}", *(f"    {x}" for x in d["differences"])]
    lines += ["SGLang's code that ran:", *(f"  {x}" for x in rep["sglang_code"]),
              "shims (no SGLang decision replaced):", *(f"  {x}" for x in rep["shims"])]
    lines.append(f"result: {'AGREE' if rep['ok'] else 'DISAGREEMENT (exit 1)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the oracle comparison and print the report; exit 1 on a disagreement."""
    p = argparse.ArgumentParser(prog="python -m kvspec.checks.conform.sglang_oracle")
    p.add_argument("--root", required=True, help="the unpacked sglang==0.5.23 wheel")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rep = run_oracle(args.root, args.count, args.seed)
    print(json.dumps(rep, indent=1))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
