"""vLLM 0.33.0's own code as an oracle for the ``vllm-0.33.0`` rule set.

Imports the installed ``vllm`` package (0.33.0, installed without its dependency tree) and drives
its functions with shims that replace no vLLM logic: KV-cache specs and a KV-cache config built
from a kvspec geometry, a namespace standing in for ``VllmConfig`` (only the fields the functions
read), a fake Mooncake store that answers existence from a set of key strings and records gets,
and objects built with ``object.__new__`` where a constructor would open network connections.
Nothing of vLLM is copied; every decision below is made by a vLLM function:

| what | vLLM 0.33.0 function driven |
| --- | --- |
| refusals, (L, u), hit alignment | ``resolve_kv_cache_block_sizes``, ``resolve_cache_hit_alignment_tokens`` |
| spec groups, EAGLE proof margins, masks | ``MooncakeStoreCoordinator.from_kv_cache_config``, ``store_mask``, ``load_mask`` |
| whole-block saves, partial-tail flag | ``RequestTracker`` + ``ReqMeta.from_request_tracker`` |
| partial-tail puts | ``store/scheduler.py: _partial_tail_non_mamba_puts`` |
| Mamba checkpoint | ``get_mamba_prefill_checkpoint_position`` |
| retained Mamba states | ``replay_boundaries``, ``MambaManager.reachable_block_mask`` |
| hit and tail boundaries (all rank namespaces) | ``MooncakeStoreWorker._init_lookup_key_prefixes``, ``.lookup``, |
| | ``._tail_key_boundaries`` |
| load keys | ``KVCacheStoreRecvingThread._handle_request`` over ``ChunkedTokenDatabase.process_tokens`` |
| key strings | ``KeyMetadata``, ``PoolKey.build_prefix`` / ``build_key_string`` |

One modelling step is kvspec's, not vLLM's: which Mamba states *exist* to be retained. Here kvspec
takes the block schedule (spec/schedule.py: a state at every Mamba block end the prefill passes, and
at the prompt checkpoint); vLLM decides which of them are kept and stored (the functions above).
Which states exist under a chunk budget — the scheduler's chunking and the core's hand-off — is
checked against vLLM's real scheduler by vllm_lifecycle.py (`kvspec conform vllm-lifecycle`).
"""

from __future__ import annotations

import functools
import importlib
import threading
import types
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kvspec.impl.mooncake_store import OBJECT_NOT_FOUND
from kvspec.spec.geometry import Geometry, compute_span
from kvspec.spec.keys import compute_lookahead_chain
from kvspec.spec.rules import VLLM_0_33
from kvspec.spec.scenario import Scenario
from kvspec.spec.store import Obj, compute_visible
from kvspec.spec.types import Boundary, GroupId, Tokens

VLLM_VERSION = "0.33.0"  # the release this oracle was written against; RELEASES lists every one it drives
MODEL = "kvspec-oracle"
_STORE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store"


@attrs.frozen(kw_only=True)
class Release:
    """What differs in how the oracle reaches one vLLM release's code: where names live and what the stand-ins
    must carry. Each field is a shim named by the vLLM change that needed it; none replaces a vLLM decision."""

    version: str
    key_module: str  # where KeyMetadata / PoolKey live ("data"; 0.34.0 moved them to store/layout.py)
    tracker_takes_hash_block_size: bool  # ReqMeta.from_request_tracker(…, hash_block_size) (0.34.0)
    worker_reads_pp_rank: bool  # MooncakeStoreWorker reads self.pp_rank and self._selective_lease (0.34.0)
    resolves_hash_lookahead: bool  # VllmConfig.num_hash_lookahead_tokens, resolved by vLLM's own
    #                                _resolve_num_hash_lookahead_tokens on the stand-in (0.34.0: lookahead on
    #                                the connector path); the coordinator and the chains then use that λ
    runner_output_takes_index: bool  # ModelRunnerOutput(req_id_to_index=…) (dropped in 0.34.0; lifecycle oracle)


RELEASES: dict[str, Release] = {
    "0.33.0": Release(version="0.33.0", key_module="data", tracker_takes_hash_block_size=False,
                      worker_reads_pp_rank=False, resolves_hash_lookahead=False, runner_output_takes_index=True),
    "0.34.0": Release(version="0.34.0", key_module="layout", tracker_takes_hash_block_size=True,
                      worker_reads_pp_rank=True, resolves_hash_lookahead=True, runner_output_takes_index=False),
}


def load_vllm() -> types.SimpleNamespace:
    """Return the vLLM modules the oracle drives and its Release; raise ImportError unless a release in RELEASES
    is importable."""

    import vllm
    release = RELEASES.get(vllm.__version__)
    if release is None:
        raise ImportError(f"the oracle drives vllm {', '.join(RELEASES)}, found {vllm.__version__}")
    mods = {name: importlib.import_module(path) for name, path in {
        "iface": "vllm.v1.kv_cache_interface", "utils": "vllm.v1.core.kv_cache_utils",
        "coord_core": "vllm.v1.core.kv_cache_coordinator", "managers": "vllm.v1.core.single_type_kv_cache_manager",
        "coord": f"{_STORE}.coordinator", "data": f"{_STORE}.data", "worker": f"{_STORE}.worker",
        "scheduler": f"{_STORE}.scheduler", "keys": f"{_STORE}.{release.key_module}"}.items()}
    return types.SimpleNamespace(**mods, release=release)


class Refused(Exception):
    """vLLM refused the configuration; ``reason`` is its own message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FakeStore:
    """A Mooncake store stand-in: existence from a set of key strings; gets recorded, answered 0 or -704."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys = frozenset(keys)
        self.gets: list[str] = []

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """Return 1 for every key present, 0 otherwise."""
        return [1 if k in self.keys else 0 for k in keys]

    def batch_get_into_multi_buffers(self, keys: Sequence[str], addrs: Any, sizes: Sequence[Any]) -> list[int]:
        """Record the keys; return the size for a present key and -704 (OBJECT_NOT_FOUND) for a missing one."""
        self.gets.extend(keys)
        return [(sum(s) if isinstance(s, list) else int(s)) if k in self.keys else OBJECT_NOT_FOUND
                for k, s in zip(keys, sizes)]


@attrs.frozen(kw_only=True)
class Answer:
    """What vLLM 0.33.0 answers for one scenario (or its refusal)."""

    refused: str | None
    stored: frozenset[Obj]
    hit: int
    tails: tuple[tuple[GroupId, Boundary], ...]
    load_keys: tuple[tuple[int, str], ...]  # (rank, key) in the receiving thread's order


def _vllm_config(v: types.SimpleNamespace, g: Geometry, eagle: bool) -> Any:
    """Return the stand-in for VllmConfig: only the fields the driven functions read. With a release that resolves
    hash lookahead, λ comes from vLLM's own VllmConfig._resolve_num_hash_lookahead_tokens on this stand-in (the
    EAGLE speculator's config from vLLM's get_method_config_class; the connector's support from its factory)."""
    spec_config = types.SimpleNamespace(use_eagle_block_drop=lambda: eagle, method="eagle", custom_method=None,
                                        draft_model_config=None, num_speculative_tokens=1,
                                        disable_lookahead_block_hashes=False)
    cfg = types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=g.groups[0].block_size, prefix_match_unit=g.unit,
                                           enable_prefix_caching=True, mamba_cache_mode="align"),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=g.parallel.dcp,
                                              prefill_context_parallel_size=g.parallel.pcp),
        kv_transfer_config=types.SimpleNamespace(kv_connector="MooncakeStoreConnector", kv_role="kv_both",
                                                 kv_connector_extra_config={}, kv_connector_module_path=None),
        speculative_config=spec_config if eagle else None)
    cfg.num_hash_lookahead_tokens = 0
    if v.release.resolves_hash_lookahead:
        from vllm.config.vllm import VllmConfig
        from vllm.v1.worker.gpu.spec_decode.speculator_config import get_method_config_class
        spec_config.speculator_config = get_method_config_class(spec_config)(spec_config)
        cfg.num_prefill_lookahead_tokens = VllmConfig.num_prefill_lookahead_tokens.fget(cfg)
        cfg.num_hash_lookahead_tokens = VllmConfig._resolve_num_hash_lookahead_tokens(cfg)
    return cfg


def _spec(v: types.SimpleNamespace, kind: str, block_size: int) -> Any:
    import torch
    if kind == "attention":
        return v.iface.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    return v.iface.MambaSpec(block_size=block_size, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode="align")


class Engine:
    """vLLM 0.33.0's connector for one geometry: configuration, coordinator and per-rank key databases."""

    def __init__(self, geometry: Geometry, v: types.SimpleNamespace | None = None) -> None:
        self.v = v = v or load_vllm()
        self.g = g = geometry
        self.eagle = any(x.eagle for x in g.groups)
        self.groups = [v.iface.KVCacheGroupSpec(layer_names=[f"layer.{i}"], kv_cache_spec=_spec(v, x.kind, x.block_size),
                                                is_eagle_group=x.eagle) for i, x in enumerate(g.groups)]
        self.config = v.iface.KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=self.groups)
        self.vllm_config = _vllm_config(v, g, self.eagle)
        try:
            self.lcm, self.unit = v.utils.resolve_kv_cache_block_sizes(self.config, self.vllm_config)
        except ValueError as exc:
            raise Refused(str(exc)) from None
        self.alignment = v.utils.resolve_cache_hit_alignment_tokens(self.config, self.vllm_config, self.lcm,
                                                                     self.unit)
        self.config.cache_hit_alignment_tokens = self.alignment
        self.config.prefix_cache_retention_interval = 0 if g.retention == "replay" else None
        self.coord = v.coord.MooncakeStoreCoordinator.from_kv_cache_config(self.config, self.vllm_config, self.lcm,
                                                                            self.unit)
        self.ranks = tuple(range(g.parallel.dcp))
        self.lookahead = int(self.vllm_config.num_hash_lookahead_tokens)  # λ as vLLM resolved it (0 before 0.34.0)

    # ------------------------------------------------------------------ keys
    def key_metadata(self, rank: int, group: int, prefix: str = "") -> Any:
        """Return vLLM's KeyMetadata of one rank's keys of one group (DCP rank = TP rank under DCP)."""
        return self.v.keys.KeyMetadata(model_name=MODEL, tp_rank=rank, pcp_rank=0,
                                       dcp_rank=rank if self.g.parallel.dcp > 1 else 0, pp_rank=0,
                                       group_id=group, cache_prefix=prefix)

    def key(self, rank: int, group: int, chain: Sequence[bytes], boundary: int) -> str:
        """Return the key string vLLM writes for one rank's shard of (group, boundary)."""
        pk = self.v.keys.PoolKey(self.key_metadata(rank, group), chain[boundary // self.unit - 1].hex())
        return str(pk.to_string())

    def token_dbs(self, rank: int) -> list[Any]:
        """Return the rank's ChunkedTokenDatabase per group (DCP-resolved block sizes)."""
        dbs = []
        for gid, grp in enumerate(self.coord.kv_cache_groups):
            db = self.v.data.ChunkedTokenDatabase(self.key_metadata(rank, gid), grp.kv_cache_spec.block_size,
                                                  self.unit)
            db.set_kv_caches_base_addr([0])
            db.store_layout.set_block_len([1])
            dbs.append(db)
        return dbs

    # ------------------------------------------------------------------ store
    def store_objects(self, prompt: int, chain: Sequence[bytes]) -> frozenset[Obj]:
        """Return the (group, boundary) objects one prompt of P tokens stores (see the module docstring)."""
        v, coord = self.v, self.coord
        if prompt <= 0:
            return frozenset()
        out: set[Obj] = set()
        sizes = [grp.kv_cache_spec.block_size for grp in coord.kv_cache_groups]
        c = v.iface.get_mamba_prefill_checkpoint_position(prompt, self.alignment, coord.use_eagle)
        # Mamba: the retained block-end states and the prompt checkpoint, handed off by the core
        mamba_puts = []
        for gid in sorted(coord.mamba_group_ids):
            spec, b = coord.kv_cache_groups[gid].kv_cache_spec, sizes[gid]
            mask = v.managers.MambaManager.reachable_block_mask(
                start_block=0, end_block=prompt // b, alignment_tokens=self.alignment, kv_cache_spec=spec,
                use_eagle=gid in coord.eagle_group_ids,
                retention_interval=self.config.prefix_cache_retention_interval,
                reachable_boundaries=v.coord_core.replay_boundaries(prompt, self.lcm, use_eagle=coord.use_eagle))
            kept = [(i + 1) * b for i in range(prompt // b) if mask is None or mask[i]]
            points = set(kept) | ({c} if c > 0 else set())
            mamba_puts += [v.data.BoundaryPut(gid, 1, t) for t in sorted(points) if t <= len(chain) * self.unit]
        out.update((GroupId(p.group_id), Boundary(p.num_tokens)) for p in mamba_puts)
        # attention: the whole-block save of the prefill, then the partial tail it publishes
        block_ids = tuple(list(range(1, -(-prompt // s) + 2)) for s in sizes)
        tracker = v.data.RequestTracker(req_id="r", token_len=prompt, allocated_block_ids=block_ids,
                                        prefill_end_tokens=prompt)
        extra = {"hash_block_size": self.unit} if v.release.tracker_takes_hash_block_size else {}
        meta = v.data.ReqMeta.from_request_tracker(tracker, self.lcm, block_hashes=list(chain),
                                                   save_partial_tail=coord.enable_partial_hash_hits,
                                                   num_prompt_tokens=prompt, **extra)
        if meta is not None and meta.can_save:
            masks = coord.store_mask(meta.token_len_chunk, 0, num_prompt_tokens=prompt)
            for gid, s in enumerate(sizes):
                if gid in coord.mamba_group_ids:
                    continue
                mask = masks[gid]
                out.update((GroupId(gid), Boundary((i + 1) * s)) for i in range(meta.token_len_chunk // s)
                           if mask is None or mask[i])
            meta.boundary_puts = mamba_puts
            for p in v.scheduler._partial_tail_non_mamba_puts(coord, meta, sizes):
                out.add((GroupId(p.group_id), Boundary(p.num_tokens)))
        return frozenset(out)

    # ------------------------------------------------------------------ lookup and load
    def worker(self, rank: int, store: FakeStore) -> Any:
        """Return a MooncakeStoreWorker of one rank with just the state lookup reads (no store connection)."""
        w = object.__new__(self.v.worker.MooncakeStoreWorker)
        w._capacity_only = False
        w.coord, w.hash_block_size, w.store = self.coord, self.unit, store
        w._kv_cache_groups = self.coord.kv_cache_groups
        w.token_dbs = self.token_dbs(rank)
        w.tp_size = w.dcp_size = self.g.parallel.dcp
        w.pcp_size = w.pp_size = 1
        if self.v.release.worker_reads_pp_rank:
            w.pp_rank, w._selective_lease = 0, None  # one PP stage; the opt-in selective lease off (its default)
        w._group_tp_replication_factors = tuple(1 for _ in self.groups)
        w._record_kv_connector_operation = lambda *a, **k: None  # metrics only
        w._init_lookup_key_prefixes()
        return w

    def lookup(self, prompt: int, chain: Sequence[bytes], store: FakeStore) -> tuple[int, tuple[tuple[GroupId, Boundary], ...]]:
        """Return vLLM's hit length and tail boundaries for a request of N tokens (rank 0's lookup server)."""
        res = self.worker(0, store).lookup(prompt, list(chain[: prompt // self.unit]))
        return res.hit_length, tuple((GroupId(t.group_id), Boundary(t.num_tokens)) for t in res.tail_key_boundaries)

    def load_keys(self, rank: int, chain: Sequence[bytes], hit: int, tails: Sequence[tuple[int, int]],
                  store: FakeStore) -> list[str]:
        """Return the keys rank r's receiving thread gets for a hit (in the plan's order, before its rotation)."""
        v = self.v
        sizes = [grp.kv_cache_spec.block_size for grp in self.coord.kv_cache_groups]
        thread = v.worker.KVCacheStoreRecvingThread(store, self.coord, self.token_dbs(rank), self.lcm, rank,
                                                    threading.Event())
        spec = v.data.LoadSpec(vllm_cached_tokens=0, kvpool_cached_tokens=hit, can_load=True, token_len=hit,
                               tail_key_boundaries=tuple(v.data.TailKeyBoundary(g, t) for g, t in tails))
        meta = v.data.ReqMeta(req_id="load", token_len_chunk=0, block_hashes=list(chain), load_spec=spec,
                              block_ids=tuple(list(range(1, -(-hit // s) + 2)) for s in sizes))
        store.gets.clear()
        thread.request_queue.put(meta)  # as the thread's run loop does: take the request, then handle it
        thread._handle_request(thread.request_queue.get())
        keys = list(store.gets)
        rot = rank % len(keys) if keys else 0
        return keys[-rot:] + keys[:-rot] if rot else keys  # undo the thread's rotation by tp_rank

    # ------------------------------------------------------------------ a whole scenario
    def answer(self, scenario: Scenario, chains: Sequence[Sequence[bytes]], lookup_chain: Sequence[bytes]) -> Answer:
        """Return vLLM's answer to a scenario: stored objects, hit, tails and every rank's load keys."""
        objs: set[Obj] = set()
        keys: set[str] = set()
        for r, chain in zip(scenario.stored, chains):
            mine = compute_visible(self.store_objects(r.prompt, chain), Tokens(r.shared), self.lookahead)
            objs |= mine
            keys |= {self.key(rank, g, lookup_chain, t) for g, t in mine for rank in self.ranks}
        keys -= {self.key(rank, g, lookup_chain, t) for g, t, rank in scenario.evicted}
        store = FakeStore(keys)
        hit, tails = self.lookup(scenario.prompt, lookup_chain, store)
        loads: list[tuple[int, str]] = []
        if hit > 0:
            for rank in self.ranks:
                loads += [(rank, k) for k in self.load_keys(rank, lookup_chain, hit, tails, store)]
        return Answer(refused=None, stored=frozenset(objs), hit=hit, tails=tails, load_keys=tuple(loads))


def compute_answer(scenario: Scenario, v: types.SimpleNamespace | None = None) -> Answer:
    """Return vLLM 0.33.0's answer to a scenario with stored requests (tokens from kvspec's request model)."""
    try:
        eng = Engine(scenario.geometry, v)
    except Refused as exc:
        return Answer(refused=exc.reason, stored=frozenset(), hit=0, tails=(), load_keys=())
    lookup_tokens, chains = scenario_tokens(scenario)
    u, lam = scenario.geometry.unit, eng.lookahead  # with λ > 0 only ⌊(n − λ)/u⌋ hashes of a request exist
    return eng.answer(scenario, [compute_lookahead_chain(t, u, lam) for t in chains],
                      compute_lookahead_chain(lookup_tokens, u, lam))


def request_tokens(length: int, seed: int = 7) -> list[int]:
    """Return the lookup request's token ids: a fixed sequence per seed (every request shares a prefix of it)."""
    return [(seed * 1_000_003 + 7919 * i) % 50_021 for i in range(length)]


def scenario_tokens(scenario: Scenario, seed: int = 7) -> tuple[list[int], list[list[int]]]:
    """Return token ids of the lookup request and of each stored request (sharing exactly S tokens with it)."""
    base = request_tokens(scenario.prompt, seed)
    out = []
    for k, r in enumerate(scenario.stored):
        toks = base[: r.shared] + [50_021 + (k * 131 + i) % 9973 for i in range(r.prompt - r.shared)]
        out.append(toks)
    return base, out



# ---------------------------------------------------------------- vLLM 0.33.0 as an engine adapter

@functools.lru_cache(maxsize=64)
def _engine(geometry: Geometry) -> Engine:
    return Engine(geometry)


_CHAINS: dict[tuple[int, int], tuple[int, tuple[bytes, ...]]] = {}  # (u, λ) → (request length, its chain)


def _chain(geometry: Geometry, length: int, lookahead: int) -> list[bytes]:
    """Return the hash chain of the lookup request's first `length` tokens (kvspec's request model): a prefix of the
    longest chain kept for (u, λ), since every request is a prefix of one token sequence and H'_t names only
    [0, t + λ) (its first ⌊(length − λ)/u⌋ hashes)."""
    u = geometry.unit
    have, chain = _CHAINS.pop((u, lookahead), (-1, ()))
    if have < length:
        have, chain = length, compute_lookahead_chain(request_tokens(length), u, lookahead)
    _CHAINS[u, lookahead] = have, chain  # the most recent last; a few (u, λ) kept
    while len(_CHAINS) > 4:
        del _CHAINS[next(iter(_CHAINS))]
    return list(chain[: max(0, length - lookahead) // u])


@attrs.frozen
class VllmAdapter:
    """vLLM 0.33.0's connector under the adapter protocol (checks/conform/adapters.py), every answer from vLLM's code.

    Objects become keys under the lookup request's chain (every object the lookup can name shares its
    prefix); the lookup runs on rank 0's lookup server over a store holding every rank's shard of E; the
    load plan is rank 0's receiving thread's gets. vLLM's gets name keys, not blocks: a full block's key
    boundary B is block B/s − 1, and a group's tail key is its hit's last block, ⌈h/s⌉ − 1.
    """

    name: str = "vllm (its own code, the installed release)"
    # its store is the prefill's functions (ReqMeta, the sending thread); a writer that decoded is the lifecycle
    # oracle's (checks/conform/vllm_lifecycle.py: vLLM's real scheduler runs the finish and the decode phase)
    claims = {"writer": ["prefill"]}

    def store_objects(self, geometry: Geometry, prompt: int, rules: str = VLLM_0_33) -> Iterable[Obj]:
        if prompt <= 0:
            return []
        eng = _engine(geometry)
        return sorted(eng.store_objects(prompt, _chain(geometry, prompt, eng.lookahead)))

    def _store(self, eng: Engine, chain: Sequence[bytes], present: frozenset[Obj]) -> FakeStore:
        return FakeStore(eng.key(r, g, chain, t) for g, t in present for r in eng.ranks)

    def lookup(self, geometry: Geometry, present: frozenset[Obj], prompt: int,
               rules: str = VLLM_0_33) -> tuple[int, dict[int, int]]:
        eng = _engine(geometry)
        chain = _chain(geometry, prompt, eng.lookahead)
        hit, tails = eng.lookup(prompt, chain, self._store(eng, chain, present))
        return hit, {int(g): int(t) for g, t in tails}

    def load_plan(self, geometry: Geometry, hit: int, tails: dict[int, int], present: frozenset[Obj] = frozenset(),
                  rules: str = VLLM_0_33) -> list[tuple[int, int, int]]:
        eng = _engine(geometry)
        chain = _chain(geometry, max([hit, *tails.values()]) + eng.lookahead, eng.lookahead)  # H'_t needs t + λ
        u, n_groups = eng.unit, len(geometry.groups)
        # the gets do not depend on E (a missing key is a failed get): a store holding every key records them. Every
        # key first at the boundaries a load may name (span multiples, the tails); a get outside them is still named:
        # the plan is then taken again over every boundary the chain has (u, 2u, …)
        spans = [compute_span(geometry, GroupId(g)) for g in range(n_groups)]
        near = {(g, b) for g in range(n_groups) for b in range(spans[g], len(chain) * u + 1, spans[g])}
        near |= set(tails.items())
        by_key = {eng.key(0, g, chain, b): (g, b) for g, b in near if b % u == 0 and 0 < b <= len(chain) * u}
        keys = eng.load_keys(0, chain, hit, sorted(tails.items()), FakeStore(by_key))
        if any(k not in by_key for k in keys):
            by_key = {eng.key(0, g, chain, (i + 1) * u): (g, (i + 1) * u) for g in range(n_groups)
                      for i in range(len(chain))}
            keys = eng.load_keys(0, chain, hit, sorted(tails.items()), FakeStore(by_key))
        out = []
        for key in keys:
            g, b = by_key[key]
            s = compute_span(geometry, GroupId(g))
            out.append((g, -(-hit // s) - 1 if b == tails.get(g) else b // s - 1, b))
        return sorted(out)


VLLM = VllmAdapter()
