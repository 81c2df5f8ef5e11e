"""vLLM's real scheduler as the oracle of the chunk schedule: a request's lifecycle, not one function at a time.

The installed release's own ``Scheduler`` (with its ``KVCacheManager``: the hybrid coordinator and the
Mamba manager in align mode) and the Mooncake store connector's scheduler side run a stored request's
prefill step by step with generated model outputs; each step's connector metadata goes through every
DCP rank's real ``KVCacheStoreSendingThread`` into a store stand-in that records the keys put. A second
engine (a fresh scheduler, so no local prefix cache) then looks the next request up through rank 0's
real ``MooncakeStoreWorker.lookup`` and every rank's real ``KVCacheStoreRecvingThread`` loads what its
connector metadata says. kvspec's answer to the same scenario (spec/schedule.py and the rule set) must
be the same: the chunk ends, the objects stored (group, boundary, rank), the hit, the tail boundaries
and every rank's load keys.

Shims, none of which makes a vLLM decision:
* ``ModelConfig`` of a local GraniteMoeHybrid ``config.json`` (one Mamba, one attention layer): no weights, no
  hub; the KV-cache config is built from the geometry.
* ``SpeculativeConfig`` of a local EAGLE ``config.json``: stands in for the draft model only; vLLM derives the
  EAGLE drop and λ.
* ``KVCacheConfig`` built by hand, with the fields ``EngineCore`` derives (hash block size, hit alignment,
  retention): no model executor profiles memory here.
* the lookup client's transport calls rank 0's ``MooncakeStoreWorker.lookup`` in process, instead of ZMQ to a
  worker process (the client keeps its own timeout and circuit breaker).
* a store stand-in: ``batch_is_exist`` / ``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``
  over key strings (the real master is exercised by the implementation's tests).
* ``ModelRunnerOutput`` with one sampled token whenever every known token is computed (no forward pass), and a
  ``KVConnectorOutput`` carrying what the ranks' threads did: completed saves, finished loads.

Kept to what vLLM builds: attention and Mamba groups share one block size (``cache_config.block_size``),
u divides it, PCP 1, interleave 1; one to four stored requests arriving together (their prefills share each
step's budget; a later one may start from the local prefix cache), then one lookup. For several requests kvspec
is given vLLM's trace (each request's chunks, the junction vLLM had pinned at each) and derives the rest. With
few KV blocks and long decodes vLLM preempts: every rank's completed saves are reported back (so the scheduler
drops their block references, as the executor's aggregated worker metadata does) and a resumed request's own
stored prefix is loaded through every rank's receiving thread. Every stored request decodes and finishes, so
what its outputs unlock is stored (0.34.0's deferred saves); a lookup that continues a request's conversation
(S > P: its tokens after the prompt are the request's outputs) names them, and in half those cases the
connector saves the decode phase (kv_connector_extra_config save_decode_cache).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import tempfile
import threading
import time
import types
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import attrs

from kvspec.checks.conform.adapters import format_explain_command
from kvspec.checks.conform.vllm_oracle import Engine, Refused, load_vllm
from kvspec.checks.rulesets import find_oracle_rules
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel, compute_lcm_span
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import compute_lookahead, compute_rule_geometry, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, compute_stored, evaluate_scenario
from kvspec.spec.schedule import Schedule, compute_checkpoints
from kvspec.spec.types import Boundary, GroupId, Rank, Tokens

VOCAB = 50_000
SAMPLED = 7  # the token every decode step samples (no forward pass)


@attrs.frozen(kw_only=True)
class LifecycleAnswer:
    """What vLLM's engine did: chunk ends of the stored prefill, objects put per rank, the second engine's lookup
    (hit, tail boundaries) and every rank's load gets as (rank, group, key boundary)."""

    refused: str | None
    chunk_ends: tuple[tuple[int, ...], ...] = ()  # per stored request
    stored: frozenset[tuple[int, int, int]] = frozenset()  # (group, boundary, rank)
    hit: int = 0
    tails: tuple[tuple[int, int], ...] = ()
    loads: tuple[tuple[int, int, int], ...] = ()  # (rank, group, key boundary), sorted
    preemptions: int = 0
    stalled: str | None = None  # vLLM made no progress (too few blocks): not compared
    junctions: tuple[tuple[int, ...], ...] = ()  # per stored request, the junction vLLM had pinned at each chunk
    starts: tuple[tuple[int, ...], ...] = ()  # the start of each chunk in chunk_ends
    evicted: frozenset[tuple[int, int, int]] = frozenset()  # (group, boundary, rank) removed before the lookup


@attrs.frozen(kw_only=True)
class Trace:
    """What vLLM's scheduler did with the stored requests: per request its chunks (ends, starts) and the junction it
    had pinned when each ran (0: none); the preemptions it made."""

    ends: tuple[tuple[int, ...], ...]
    starts: tuple[tuple[int, ...], ...]
    junctions: tuple[tuple[int, ...], ...]
    preemptions: int


class Stalled(Exception):
    """vLLM's engine made no progress (fewer KV blocks than one request needs): a capacity the spec does not
    model, so the case is counted, not compared."""


class RecordingStore:
    """A Mooncake store stand-in over key strings: puts are recorded, gets answer 0 or -704 and are recorded."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.gets: list[str] = []

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """Return 1 for every key present, 0 otherwise."""
        return [1 if k in self.keys else 0 for k in keys]

    def batch_put_from_multi_buffers(self, keys: Sequence[str], addrs: Any, sizes: Any, config: Any = None) -> list[int]:
        """Record every key; return 0 (success) for each."""
        self.keys.update(keys)
        return [0 for _ in keys]

    def batch_get_into_multi_buffers(self, keys: Sequence[str], addrs: Any, sizes: Sequence[Any]) -> list[int]:
        """Record the keys; return the size for a present key and -704 for a missing one."""
        self.gets.extend(keys)
        return [(sum(s) if isinstance(s, list) else int(s)) if k in self.keys else -704 for k, s in zip(keys, sizes)]


@functools.lru_cache(maxsize=1)
def _model_dirs() -> tuple[str, str]:
    """Return (target, draft) folders holding the config.json files vLLM's configs read (written once)."""
    root = tempfile.mkdtemp(prefix="kvspec-lifecycle-")
    target = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
              "vocab_size": VOCAB + 1024, "hidden_size": 256, "intermediate_size": 512, "shared_intermediate_size": 512,
              "num_local_experts": 0, "num_experts_per_tok": 0, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 1, "layer_types": ["mamba", "attention"], "mamba_n_heads": 8, "mamba_d_head": 32,
              "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 1, "mamba_chunk_size": 256,
              "max_position_embeddings": 1 << 22, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "torch_dtype": "float32", "position_embedding_type": "rope"}
    draft = {"architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB + 1024,
             "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 8,
             "num_key_value_heads": 1, "max_position_embeddings": 1 << 22, "rms_norm_eps": 1e-5,
             "torch_dtype": "float32"}
    out = []
    for name, cfg in (("target", target), ("draft", draft)):
        os.makedirs(os.path.join(root, name))
        with open(os.path.join(root, name, "config.json"), "w") as f:
            json.dump(cfg, f)
        out.append(os.path.join(root, name))
    return out[0], out[1]


def check_lifecycle_geometry(geometry: Geometry) -> str | None:
    """Return why vLLM's engine cannot be built for a geometry here (None when it can)."""
    sizes = {g.block_size for g in geometry.groups}
    kinds = [g.kind for g in geometry.groups]
    if len(sizes) != 1:
        return "vLLM's groups share cache_config.block_size; this geometry's differ"
    if kinds.count("mamba") != 1 or kinds.count("attention") < 1:
        return "the lifecycle oracle builds one Mamba layer and attention groups"
    if geometry.parallel.pcp != 1 or geometry.parallel.interleave != 1:
        return "PCP and interleave are not driven by the lifecycle oracle"
    if next(iter(sizes)) % geometry.unit:
        return "u must divide the block size"
    return None


class Lifecycle:
    """One geometry and schedule on the installed vLLM release's real scheduler."""

    def __init__(self, geometry: Geometry, schedule: Schedule, max_len: int,
                 v: types.SimpleNamespace | None = None, num_blocks: int | None = None,
                 save_decode_cache: bool = False) -> None:
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
            VllmConfig,
        )
        self.v = v = v or load_vllm()
        why = check_lifecycle_geometry(geometry)
        if why:
            raise Refused(why)
        self.g, self.schedule = geometry, schedule
        self.eng = Engine(geometry, v)  # the connector's coordinator, key databases and rank workers
        d, b = geometry.parallel.dcp, geometry.groups[0].block_size
        target, draft = _model_dirs()
        budget = schedule.budget if schedule.budget is not None else b
        max_len = -(-(max_len + 64) // b) * b
        mc = ModelConfig(model=target, skip_tokenizer_init=True, max_model_len=max_len, dtype="float32")
        pc = ParallelConfig(tensor_parallel_size=d, decode_context_parallel_size=d)
        spec = None
        if any(x.eagle for x in geometry.groups):
            spec = SpeculativeConfig(method="eagle", model=draft, num_speculative_tokens=1, target_model_config=mc,
                                     target_parallel_config=pc)
        cc = CacheConfig(block_size=b, enable_prefix_caching=True, mamba_cache_mode="align",
                         prefix_match_unit=geometry.unit,
                         prefix_cache_retention_interval=0 if geometry.retention == "replay" else None)
        # with few blocks, admit on the first chunk (not the whole prompt) so that running requests collide and
        # vLLM preempts (scheduler_reserve_full_isl, a deployment option; default True)
        sc = SchedulerConfig(max_num_batched_tokens=budget, max_model_len=max_len, max_num_seqs=4,
                             enable_chunked_prefill=schedule.chunked, is_encoder_decoder=False,
                             long_prefill_token_threshold=schedule.long_prefill_threshold,
                             scheduler_reserve_full_isl=num_blocks is None)
        kv = KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both",
                              kv_connector_extra_config={"save_decode_cache": True} if save_decode_cache else {})
        self.config = VllmConfig(model_config=mc, cache_config=cc, parallel_config=pc, scheduler_config=sc,
                                 device_config=DeviceConfig(device="cpu"), kv_transfer_config=kv,
                                 speculative_config=spec)
        groups = []
        for i, x in enumerate(geometry.groups):
            if x.kind == "attention":
                kspec = v.iface.FullAttentionSpec(block_size=b, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
            else:
                extra = ({"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": schedule.checkpoint_alignment}
                         if schedule.checkpoint_alignment is not None else {})
                kspec = v.iface.MambaSpec(block_size=b, shapes=((4,),), dtypes=(torch.float32,),
                                          mamba_cache_mode="align", **extra)
            groups.append(v.iface.KVCacheGroupSpec(layer_names=[f"layer.{i}"], kv_cache_spec=kspec,
                                                   is_eagle_group=x.eagle))
        self.num_blocks = num_blocks or 4 * (max_len // b + 8) * len(groups)
        self.config.cache_config.num_gpu_blocks = self.num_blocks
        self.groups = groups

    def _kv_cache_config(self) -> Any:
        v = self.v
        kcc = v.iface.KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=self.groups)
        lcm, unit = v.utils.resolve_kv_cache_block_sizes(kcc, self.config)
        kcc.hash_block_size = unit
        kcc.cache_hit_alignment_tokens = v.utils.resolve_cache_hit_alignment_tokens(kcc, self.config, lcm, unit)
        kcc.prefix_cache_retention_interval = self.config.cache_config.prefix_cache_retention_interval
        return kcc, lcm, unit

    def scheduler(self, store: RecordingStore) -> Any:
        """Return a fresh vLLM Scheduler (empty local prefix cache) whose connector looks up through rank 0's real
        worker lookup over `store`."""
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager
        kcc, lcm, unit = self._kv_cache_config()
        s = Scheduler(vllm_config=self.config, kv_cache_config=kcc,
                      structured_output_manager=StructuredOutputManager(self.config), block_size=lcm,
                      hash_block_size=unit)
        worker = self.eng.worker(0, store)  # type: ignore[arg-type]  # the same three store calls as FakeStore
        # the transport only (0.34.0 passes a deadline too): the client keeps its own timeout and circuit breaker
        s.connector.connector_scheduler.client._lookup = lambda n, hashes, *_: worker.lookup(n, list(hashes))
        return s

    def request(self, req_id: str, tokens: Sequence[int], decode: int = 2) -> Any:
        """Return a vLLM Request of the tokens, hashed by vLLM's own request block hasher (the config's λ)."""
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.request import Request
        hash_fn = get_hash_fn_by_name(self.config.cache_config.prefix_caching_hash_algo)
        self.v.utils.init_none_hash(hash_fn)
        hasher = self.v.utils.get_request_block_hasher(self.g.unit, hash_fn, self.config.num_hash_lookahead_tokens)
        return Request(req_id, list(tokens), SamplingParams(max_tokens=decode, ignore_eos=True), None,
                       block_hasher=hasher)

    def _senders(self, store: RecordingStore) -> list[Any]:
        sw = self.v.worker
        n = len(self.g.groups)
        return [sw.KVCacheStoreSendingThread(store, self.eng.coord, self.eng.token_dbs(r), self.eng.lcm, r, [1] * n,
                                             "kv_both", threading.Event())
                for r in self.eng.ranks]

    def prefill(self, prompts: Sequence[Sequence[int]], store: RecordingStore, decode: int = 2) -> Trace:
        """Run stored requests, all arriving at once, to completion on a fresh scheduler (their prefills share each
        step's budget first come first served; with few blocks vLLM preempts and resumes them); every step's
        connector metadata goes through each rank's sending thread into `store`. Return what the scheduler did
        (a resumed request ends chunks again); raise Stalled when the engine makes no progress."""
        from vllm.v1.outputs import ModelRunnerOutput
        s, senders = self.scheduler(store), self._senders(store)
        reqs = [self.request(f"stored-{k}", toks, decode) for k, toks in enumerate(prompts)]
        for r in reqs:
            s.add_request(r)
        ends: list[list[int]] = [[] for _ in reqs]
        starts: list[list[int]] = [[] for _ in reqs]
        pins: list[list[int]] = [[] for _ in reqs]  # the junction vLLM had pinned when each chunk ran (0: none)
        preemptions = 0
        for _ in range(sum(len(t) for t in prompts) + 8 * decode + 64):  # prefill chunks, decode steps, then a step that flushes
            out = s.schedule()                               # the finish-time hand-offs into the next metadata
            preemptions += len(out.preempted_req_ids or ())
            ids = []
            for k, r in enumerate(reqs):
                n = out.num_scheduled_tokens.get(r.request_id, 0)
                if n:
                    ids.append(r.request_id)
                    if r.num_computed_tokens <= r.num_prompt_tokens and r.num_computed_tokens - n < r.num_prompt_tokens:
                        ends[k].append(r.num_computed_tokens)
                        starts[k].append(r.num_computed_tokens - n)
                        pins[k].append(int(r.shared_prefix_boundary))
            loaded: set[str] = set()
            for meta in getattr(out.kv_connector_metadata, "requests", []):
                if meta.can_save:
                    for t in senders:
                        t.add_request(meta)
                        t._handle_request(t.request_queue.get())
                if meta.load_spec is not None and meta.load_spec.can_load:  # a resumed request's own stored prefix
                    self._load(meta, store)
                    loaded.add(meta.req_id)
            # every rank reports the store jobs it finished, so the scheduler drops their block references (what
            # each worker's build_connector_worker_meta sends, aggregated as the executor does)
            done_saves = self.v.data.MooncakeStoreWorkerMetadata()
            for t in senders:
                done_saves.aggregate(self.v.data.MooncakeStoreWorkerMetadata(completed_saves=t.take_completed_saves()))
            if all(r.is_finished() for r in reqs):
                break
            extra = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if self.v.release.runner_output_takes_index \
                else {}
            by_id = {r.request_id: r for r in reqs}
            sampled = [[SAMPLED] if by_id[i].num_computed_tokens >= by_id[i].num_tokens else [] for i in ids]  # every known
            # token computed (a resumed request re-prefills its outputs too): the step samples one
            from vllm.v1.outputs import KVConnectorOutput
            s.update_from_output(out, ModelRunnerOutput(req_ids=ids, **extra, sampled_token_ids=sampled,
                                                        kv_connector_output=KVConnectorOutput(
                                                            kv_connector_worker_meta=done_saves,
                                                            finished_recving=loaded or None)))
        else:
            raise Stalled("the engine stalled: too few KV blocks for one request")
        return Trace(ends=tuple(tuple(e) for e in ends), starts=tuple(tuple(x) for x in starts),
                     junctions=tuple(tuple(j) for j in pins), preemptions=preemptions)

    def _load(self, meta: Any, store: RecordingStore) -> list[tuple[int, str]]:
        """Run every rank's receiving thread on one load request (what start_load_kv queues); return its gets."""
        meta.load_spec.token_len = meta.load_spec.kvpool_cached_tokens  # what the worker's start_load_kv sets
        gets: list[tuple[int, str]] = []
        for r in self.eng.ranks:
            thread = self.v.worker.KVCacheStoreRecvingThread(store, self.eng.coord, self.eng.token_dbs(r),
                                                             self.eng.lcm, r, threading.Event())
            store.gets.clear()
            thread.request_queue.put(meta)
            thread._handle_request(thread.request_queue.get())
            gets += [(r, k) for k in store.gets]
        return gets

    def lookup(self, tokens: Sequence[int], store: RecordingStore) -> tuple[int, tuple[tuple[int, int], ...],
                                                                             list[tuple[int, str]]]:
        """Look a request up on a second engine; return (hit, tail boundaries, every rank's gets)."""
        s = self.scheduler(store)
        req = self.request("lookup", tokens)
        s.add_request(req)
        out = s.schedule()
        loads: list[tuple[int, str]] = []
        hit, tails = 0, tuple[tuple[int, int], ...]()
        for meta in getattr(out.kv_connector_metadata, "requests", []):
            spec = meta.load_spec
            if spec is None or not spec.can_load:
                continue
            hit = int(spec.kvpool_cached_tokens)
            tails = tuple((int(t.group_id), int(t.num_tokens)) for t in spec.tail_key_boundaries)
            loads += self._load(meta, store)
        return hit, tails, loads

    def answer(self, stored: Sequence[Sequence[int]], lookup: Sequence[int], decode: int = 2,
               evict: Sequence[tuple[int, int]] = ()) -> LifecycleAnswer:
        """Return what vLLM's engine does: store the `stored` requests cold, evict shards (`evict`: (k, rank): the
        k-th object the lookup can name, sorted, modulo their count, on one rank or on every rank for -1), then look
        `lookup` up on a second engine."""
        store = RecordingStore()
        trace = self.prefill(stored, store, decode)
        hashes = self.request("index", lookup).block_hashes
        index = {self.eng.key(r, gi, hashes, (i + 1) * self.g.unit): (gi, (i + 1) * self.g.unit, r)
                 for r in self.eng.ranks for gi in range(len(self.g.groups)) for i in range(len(hashes))}
        stored_objs = frozenset(index[k] for k in store.keys if k in index)
        objs = sorted({(g, t) for g, t, _ in stored_objs})
        gone = frozenset((g, t, r) for k, rank in evict if objs for g, t in [objs[k % len(objs)]]
                         for r in (self.eng.ranks if rank < 0 else (rank % len(self.eng.ranks),)))
        store.keys -= {self.eng.key(r, g, hashes, t) for g, t, r in gone}
        hit, tails, gets = self.lookup(lookup, store)
        loads = tuple(sorted((r, index[k][0], index[k][1]) for r, k in gets if k in index))
        return LifecycleAnswer(refused=None, chunk_ends=trace.ends, stored=stored_objs, hit=hit, tails=tails,
                               loads=loads, preemptions=trace.preemptions, junctions=trace.junctions,
                               starts=trace.starts, evicted=gone)


def lifecycle_tokens(requests: Sequence[tuple[int, int]], lookup: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """Return (stored, lookup) token ids: the lookup request's tokens, and each stored request (P, S) sharing
    exactly S tokens with it (its own tokens after that). S > P: the lookup continues the request's conversation, its
    tokens P .. S − 1 the request's outputs (the driver samples SAMPLED), then tokens of its own."""
    base = [(seed * 1_000_003 + 7919 * i) % VOCAB for i in range(max([lookup, *(p for p, _ in requests)]))]
    stored = [base[:min(s, p)] + [VOCAB + (i * 131 + seed + 17 * k) % 1000 for i in range(p - s)]
              for k, (p, s) in enumerate(requests)]
    look = base[:lookup]
    for p, s in requests:
        if s > p:
            look = base[:p] + [SAMPLED] * (s - p) + [VOCAB + 2000 + i for i in range(lookup - s)]
    return stored, look


def compute_lifecycle_answer(geometry: Geometry, schedule: Schedule, requests: Sequence[tuple[int, int]], lookup: int,
                             seed: int = 7, num_blocks: int | None = None, decode: int = 2,
                             evict: Sequence[tuple[int, int]] = (),
                             v: types.SimpleNamespace | None = None, save_decode_cache: bool = False) -> LifecycleAnswer:
    """Return vLLM's lifecycle answer for stored requests (P, S) arriving together and one lookup of `lookup` tokens;
    `num_blocks` KV blocks (None: plenty; few: vLLM preempts)."""
    try:
        lc = Lifecycle(geometry, schedule, max([lookup, *(p for p, _ in requests)]) + decode, v, num_blocks,
                       save_decode_cache)
        stored, look = lifecycle_tokens(requests, lookup, seed)
        return lc.answer(stored, look, decode, evict)
    except Refused as exc:  # the connector's own block-size resolution refused the geometry
        return LifecycleAnswer(refused=exc.reason)
    except Stalled as exc:
        return LifecycleAnswer(refused=None, stalled=str(exc))


# ---------------------------------------------------------------- generated scenarios and the comparison

FIELDS = ("refusal", "chunk_ends", "stored", "hit", "tails", "loads")
BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
MAX_TOKENS = 60_000


@attrs.frozen(kw_only=True)
class LifecycleCase:
    """Stored requests (P, S) arriving together, computed under `schedule` with `num_blocks` KV blocks (None:
    plenty), then one lookup of `lookup` tokens sharing S with each."""

    geometry: Geometry
    schedule: Schedule
    requests: tuple[tuple[int, int], ...]
    lookup: int
    num_blocks: int | None = None
    decode: int = 2  # tokens each stored request generates before it finishes (long decodes with few blocks: vLLM
    #                  preempts); a request (P, S) with S > P: the lookup continues its conversation through S − P outputs
    evict: tuple[tuple[int, int], ...] = ()  # shards removed before the lookup: (k-th nameable object, rank or -1)
    save_decode_cache: bool = False  # the connector saves the decode phase too (kv_connector_extra_config)

    def scenario(self, rules: str, ends: tuple[tuple[int, ...], ...] | None = None,
                 junctions: tuple[tuple[int, ...], ...] = (), starts: tuple[tuple[int, ...], ...] = ()) -> Any:
        """Return kvspec's scenario of the case under a rule set; with `ends`, each request's observed chunk ends
        and shared-prefix junction (a trace) instead of the schedule's derivation."""
        # a request served whole from the local prefix cache computed only its last token: the chunk (P − 1, P)
        stored = tuple(StoredRequest(prompt=p, shared=s, decoded=self.decode, save_decode_cache=self.save_decode_cache,
                                     schedule=None if ends is None else
                                     Schedule(ends=ends[k] or (p,),
                                              junctions=(junctions[k] or (0,)) if junctions else (),
                                              starts=(starts[k] or (p - 1,)) if starts else (),
                                              checkpoint_alignment=self.schedule.checkpoint_alignment))
                       for k, (p, s) in enumerate(self.requests))
        return Scenario(geometry=self.geometry, prompt=self.lookup, rules=rules, stored=stored,
                        schedule=self.schedule if ends is None else BLOCK)

    def derives(self) -> bool:
        """Return whether kvspec derives the chunk ends itself: one stored request with room for it (no
        preemption); otherwise the first request's ends are derived and the rest compared from the trace."""
        return len(self.requests) == 1 and self.num_blocks is None

    def command(self, rules: str) -> str:
        """Return the runnable `kvspec explain` command of the case (its schedule flags; a trace: the JSON line)."""
        s = self.schedule
        extra = [f"--chunk-budget {s.budget}"] if s.budget is not None else []
        if s.checkpoint_alignment is not None:
            extra.append(f"--checkpoint-alignment {s.checkpoint_alignment}")
        if s.long_prefill_threshold:
            extra.append(f"--long-prefill-threshold {s.long_prefill_threshold}")
        if not s.chunked:
            extra.append("--no-chunked-prefill")
        note = "" if self.derives() else f"  # {len(self.requests)} concurrent requests, {self.num_blocks} blocks, " \
                                         f"decode {self.decode}"
        if self.evict:
            note += f"  # evicted before the lookup: {list(self.evict)} (k-th nameable object, rank; -1: all)"
        return " ".join([format_explain_command(attrs.evolve(self.scenario(rules), schedule=BLOCK)), *extra]) + note


BLOCK = Schedule()


def draw_lifecycle_case(rng: random.Random) -> LifecycleCase:
    """Return one generated case: u in 16..128, b = q·u, D in {1, 2, 4, 8}, EAGLE or not, either retention,
    budgets 256..65536 (and b, b/2), prefill checkpoint blocks in one case of five; prompts around multiples of
    L and of b, below MAX_TOKENS; the lookup identical, longer or sharing a random prefix; in one case of four,
    one or two stored objects evicted on one rank or on all before the lookup. One case in three
    stores 2-4 requests at once (sharing each step's budget), half of those with KV blocks for about one and a
    half of them, so vLLM preempts and resumes. One lone request in four decodes 1-4 tokens (with save_decode_cache,
    half of them: up to 3L + b) and the lookup continues its conversation through some of them (half of those
    prompts end on L: what the finish-time save adds)."""
    u = rng.choice([16, 32, 64, 128])
    b = u * rng.choice([1, 2, 3, 4, 6, 8, 12])
    eagle = rng.random() < 0.5
    groups = [Group(kind="attention", block_size=b, eagle=eagle)]
    if rng.random() < 0.2:
        groups.append(Group(kind="attention", block_size=b, eagle=eagle and rng.random() < 0.5))
    groups.append(Group(kind="mamba", block_size=b))
    g = Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=rng.choice([1, 2, 4, 8])),
                 retention=rng.choice(["replay", "dense"]))
    lcm = compute_lcm_span(g)
    top = min(MAX_TOKENS, 4 * lcm + 3 * b)

    def length() -> int:
        unit = lcm if rng.random() < 0.5 else b
        k = rng.randint(1, max(1, top // unit))
        return max(1, min(top, k * unit + rng.randint(-2 * u, 2 * u)))

    n = length()
    budget = rng.choice([*BUDGETS, b, max(1, b // 2), rng.randint(256, 65536)])
    schedule = Schedule(budget=budget, checkpoint_alignment=rng.choice([None, None, None, None, 16, 1]))
    count = 1 if rng.random() < 2 / 3 else rng.randint(2, 4)
    requests = []
    for _ in range(count):
        p = rng.choice([n, n, n - rng.randint(0, 2 * u), length()]) if count > 1 or rng.random() < 0.5 else length()
        p = max(1, p)
        s = rng.choice([min(p, n), min(p, n), rng.randint(0, min(p, n))])
        requests.append((p, s))
    if count == 1 and rng.random() < 0.5:
        n = rng.choice([requests[0][0], requests[0][0] + rng.randint(1, 3 * u)])
        requests[0] = (requests[0][0], min(requests[0][0], n))
    blocks, decode = None, 2
    if count > 1 and rng.random() < 0.5:  # room for about one and a half requests, long decodes: vLLM preempts
        decode = rng.randint(64, 8 * b)
        longest = max(p for p, _ in requests) + decode
        per = len(groups) * (-(-longest // (b * g.parallel.dcp)) + 4)
        blocks = per + per // 4
    evict = tuple((rng.randint(0, 99), rng.choice([-1, rng.randint(0, 7)])) for _ in range(rng.randint(1, 2))) \
        if rng.random() < 0.25 else ()
    save_decode_cache = False
    if count == 1 and rng.random() < 0.25:  # the lookup continues the conversation: through some of its outputs
        save_decode_cache = rng.random() < 0.5  # then the decode phase is stored too: decode a few blocks
        decode = rng.randint(1, 3 * lcm + b) if save_decode_cache else rng.randint(1, 4)
        p = requests[0][0] if rng.random() < 0.5 else max(lcm, requests[0][0] // lcm * lcm)  # on L: a finish-time save
        s = p + rng.randint(1, decode)
        requests[0], n = (p, s), s + rng.choice([0, rng.randint(1, 3 * u)])
    return LifecycleCase(geometry=g, schedule=schedule, requests=tuple(requests), lookup=n, num_blocks=blocks,
                         decode=decode, evict=evict, save_decode_cache=save_decode_cache)


def compute_spec_lifecycle(case: LifecycleCase, rules: str, ends: tuple[tuple[int, ...], ...] | None = None,
                           junctions: tuple[tuple[int, ...], ...] = (),
                           starts: tuple[tuple[int, ...], ...] = (),
                           evicted: frozenset[tuple[int, int, int]] = frozenset()) -> LifecycleAnswer:
    """Return kvspec's answer to a case in the oracle's terms (with `ends`: from the observed chunk ends and
    junctions)."""
    try:
        sc = case.scenario(rules, ends, junctions, starts)
        if evicted:
            sc = attrs.evolve(sc, evicted=frozenset((GroupId(g), Boundary(t), Rank(r)) for g, t, r in evicted))
    except SpecError as err:
        return LifecycleAnswer(refused=f"{err.rule}: {err.message}")
    rs, g = get_rules(rules), case.geometry
    lam = compute_lookahead(rs, g)
    derived = tuple(tuple(int(e) for e in compute_checkpoints(case.schedule, compute_rule_geometry(rs, g), Tokens(p),
                                                              lam).ends) for p, _ in case.requests)
    ranks = range(g.parallel.dcp)
    stored = frozenset((gi, t, r) for gi, t in compute_stored(sc) for r in ranks)
    out = evaluate_scenario(sc)
    loads = tuple(sorted((r, e.group, e.key_boundary) for e in out.load for r in ranks))
    return LifecycleAnswer(refused=None, chunk_ends=derived, stored=stored, hit=out.hit_length,
                           tails=tuple((int(a), int(b)) for a, b in out.tails), loads=loads)


def compare_lifecycle(case: LifecycleCase, rules: str, v: types.SimpleNamespace | None = None) -> dict[str, bool]:
    """Return per-field agreement of kvspec and vLLM's engine on one case (see compare_answers)."""
    return compare_answers(case, rules, compute_case_answer(case, v))


def compute_case_answer(case: LifecycleCase, v: types.SimpleNamespace | None = None) -> LifecycleAnswer:
    """Return vLLM's answer to a case."""
    return compute_lifecycle_answer(case.geometry, case.schedule, case.requests, case.lookup,
                                    num_blocks=case.num_blocks, decode=case.decode, evict=case.evict, v=v,
                                    save_decode_cache=case.save_decode_cache)


def compare_answers(case: LifecycleCase, rules: str, theirs: LifecycleAnswer) -> dict[str, bool]:
    """Return per-field agreement of kvspec with vLLM's answer to a case (only `refusal` when either refuses; none
    when vLLM stalled).

    chunk_ends: kvspec's derivation against vLLM's chunks for a lone request, and for the first of several (first
    come, first served: its chunks do not depend on the others) when it was not preempted. The other fields: from
    kvspec's derivation for a lone request, from the observed chunk ends otherwise."""
    if theirs.stalled:
        return {}
    trace = not case.derives() and theirs.refused is None
    mine = compute_spec_lifecycle(case, rules, theirs.chunk_ends if trace else None, theirs.junctions if trace else (),
                                  theirs.starts if trace else (), theirs.evicted)
    if mine.refused is not None or theirs.refused is not None:
        return {"refusal": (mine.refused is None) == (theirs.refused is None)}
    out = {"refusal": True, "stored": mine.stored == theirs.stored, "hit": mine.hit == theirs.hit,
           "tails": mine.tails == theirs.tails, "loads": mine.loads == theirs.loads}
    first = theirs.chunk_ends[0]
    if case.derives():
        out["chunk_ends"] = mine.chunk_ends == theirs.chunk_ends
    elif all(a < b for a, b in zip(first, first[1:])):  # the first request ran through without a preemption
        out["chunk_ends"] = mine.chunk_ends[0] == first
    return out


def iterate_lifecycle_cases(count: int, seed: int) -> list[LifecycleCase]:
    """Return `count` generated cases, then issue 29's measured Kimi-like cases."""
    rng = random.Random(seed)
    cases = [draw_lifecycle_case(rng) for _ in range(count)]
    kimi = get_preset("kimi-k3-dcp8")
    for p, budget, retention, shared, look in ((15000, 2048, "replay", 15000, 15000), (30000, 32768, "replay", 30000, 30000),
                                               (26000, 32768, "dense", 20000, 30000), (30000, 2048, "replay", 20000, 30000),
                                               (15000, 16384, "dense", 15000, 15000)):
        cases.append(LifecycleCase(geometry=attrs.evolve(kimi, retention=retention), schedule=Schedule(budget=budget),
                                   requests=((p, shared),), lookup=look))
    return cases


def quiet_vllm() -> None:
    """Keep vLLM's configuration warnings (small budgets, tiny max_model_len) out of the report: errors only."""
    logging.getLogger("vllm").setLevel(logging.ERROR)


def run_lifecycle_conformance(count: int = 300, seed: int = 0, rules: str | None = None) -> dict[str, Any]:
    """Return the report of kvspec's rule set for the installed release against its real scheduler."""

    version = metadata.version("vllm")
    rules = rules or find_oracle_rules("vllm", version)
    if rules is None:
        raise ImportError(f"no rule set names vLLM {version} as its oracle (checks/rulesets.py)")
    v = load_vllm()
    quiet_vllm()
    t0 = time.perf_counter()
    agree = dict.fromkeys(FIELDS, 0)
    compared = dict.fromkeys(FIELDS, 0)
    bad: list[dict[str, Any]] = []
    cases = iterate_lifecycle_cases(count, seed)
    kinds = {"one request": 0, "concurrent": 0, "with preemption": 0, "with evictions": 0,
             "continuing a conversation": 0, "stalled (not compared)": 0}
    for case in cases:
        theirs = compute_case_answer(case, v)
        res = compare_answers(case, rules, theirs)
        kinds["one request" if len(case.requests) == 1 else "concurrent"] += 1
        kinds["with preemption"] += theirs.preemptions > 0
        kinds["with evictions"] += bool(case.evict)
        kinds["continuing a conversation"] += any(s > p for p, s in case.requests)
        kinds["stalled (not compared)"] += not res
        for f, ok in res.items():
            compared[f] += 1
            agree[f] += ok
        if not all(res.values()) and len(bad) < 10:
            bad.append({"fields": [f for f, ok in res.items() if not ok], "command": case.command(rules)})
    return {"rules": rules, "vllm": version, "seed": seed, "cases": len(cases), "kinds": kinds, "compared": compared,
            "agree": agree,
            "disagreements": bad, "ok": all(agree[f] == compared[f] for f in FIELDS),
            "seconds": round(time.perf_counter() - t0, 1)}


def format_lifecycle_report(rep: dict[str, Any]) -> str:
    """Return the readable report."""
    kinds = ", ".join(f"{v} {k}" for k, v in rep["kinds"].items())
    out = [f"kvspec conform vllm-lifecycle: rule set {rep['rules']} vs vLLM {rep['vllm']}'s real scheduler, seed "
           f"{rep['seed']}, {rep['cases']} cases ({kinds}), {rep['seconds']} s"]
    for f in FIELDS:
        c, a = rep["compared"][f], rep["agree"][f]
        out.append(f"  {f:<10} {a:>6} / {c:<6} agree ({100.0 * a / c if c else 100.0:.2f}%)")
    for d in rep["disagreements"]:
        out.append(f"  DISAGREE on {', '.join(d['fields'])}: {d['command']}")
    out.append("result: " + ("100% agreement" if rep["ok"] else "DISAGREEMENT (exit 1)"))
    return "\n".join(out)
