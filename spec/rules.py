"""Rule sets: named, versioned variants of the spec, each a delta over its predecessor.

Like a consensus spec's forks: ``legacy`` (the loader before vLLM PR #53324), ``pr53324`` (the
PR's rules and its worked table), ``vllm-0.33.0`` (what that release's connector does),
``vllm-0.33.0-lookahead`` (kvspec's proposal: lookahead hashes everywhere), ``vllm-0.34.0`` (the
release that shipped lookahead hashes where an EAGLE-family drafter needs them; the default) and
``sglang-0.5.23`` (a second engine: SGLang's HiCache L3 on Mooncake, whole-page hits).
A rule set is one frozen value; the stages that differ between rule sets dispatch on its fields
(store rule, tail key, configuration refusals, hash lookahead, what a writer stores once it decoded),
nothing else.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import attrs

from .errors import SpecError
from .geometry import Geometry, compute_span, has_eagle
from .types import GroupId

if TYPE_CHECKING:  # the steps sit above the rule sets that select them (spec/scenario.py)
    from .scenario import Stages

RULE_RULES = "rules"
RULE_VLLM_UNIT = "vllm-prefix-match-unit"

STORE_PR53324 = "pr53324"  # T = ⌊P/u⌋·u − e·u; tail only when T is off some Mamba block; replay keeps R
STORE_VLLM_0_33 = "vllm-0.33.0"  # checkpoint C, attention published to C + proof margin, replay boundaries
STORE_SGLANG = "sglang-0.5.23"  # whole pages only; one Mamba state per request, at its last grid point

TAIL_STORED = "stored"  # the tail block's key is the boundary it was stored at (B_g)
TAIL_HIT = "hit"  # the tail block's key is H_h (the bug #53324 fixed)

LOOKAHEAD_ALWAYS = "always"  # λ applies to every geometry (kvspec's proposal set)
LOOKAHEAD_DRAFTER = "drafter"  # λ applies only where an EAGLE-family drafter needs the drop (vLLM 0.34.0); else 0
LOOKAHEAD_DRAFTER_NO_MAMBA = "drafter-without-mamba"  # λ only with an EAGLE drafter and no Mamba group (SGLang's
#                                                        bigram keys, switched off for Mamba hybrids); else 0

CONFIG_KVSPEC = "kvspec"  # the geometry rules of spec/geometry.py only
CONFIG_VLLM_0_33 = "vllm-0.33.0"  # plus what 0.33.0's configuration resolution refuses
CONFIG_SGLANG = "sglang-0.5.23"  # plus what SGLang 0.5.23's HiCache L3 refuses (whole-page hits, DCP limits)

RULE_SGLANG_PAGE = "sglang-page"
RULE_SGLANG_GRID = "sglang-mamba-grid"
RULE_SGLANG_RETENTION = "sglang-retention"
RULE_SGLANG_DCP = "sglang-dcp"


# the rule sets' names (RULE_SETS below holds the values)
LEGACY = "legacy"
PR53324 = "pr53324"
VLLM_0_33 = "vllm-0.33.0"
VLLM_0_33_LOOKAHEAD = "vllm-0.33.0-lookahead"
VLLM_0_34 = "vllm-0.34.0"
SGLANG_0_5_23 = "sglang-0.5.23"
SGLANG_0_5_23_BIGRAM = "sglang-0.5.23-bigram"


@attrs.frozen(kw_only=True)
class Delta:
    """One rule changed by a rule set: what, in kvspec's words, and the engine function that decides it."""

    what: str
    where: str


@attrs.frozen(kw_only=True, cache_hash=True)
class RuleSet:
    """A named rule set: the store rule, the tail-key rule, configuration refusals, hash lookahead, what a writer
    stores past its prefill (deferred saves, decode-phase states), and the steps it replaces (a mutant's: its own
    store, present, lookup, tails, plan, safe or retry rule; None: the spec's, spec/scenario.py SPEC_STAGES)."""

    name: str
    predecessor: str | None
    engine: str
    store: str
    tail_key: str
    config: str
    lookahead: int  # tokens past a unit that its hash also covers (0: the legacy hashes)
    deltas: tuple[Delta, ...]
    lookahead_scope: str = LOOKAHEAD_ALWAYS  # where λ applies: every geometry, or only one with an EAGLE-family drafter
    eagle_drop: bool = True  # an EAGLE-flagged group's hit drops its last unit when λ = 0 (vLLM); False: never (SGLang)
    deferred_saves: bool = False  # λ > 0: boundaries whose hash waits for outputs are stored once those exist
    decode_states: bool = False  # save_decode_cache also stores decode-phase Mamba states (retention 0 becomes L)
    stages: Stages | None = None  # the steps this rule set replaces (checks/verify/mutants.py); None: the spec's own

    def __str__(self) -> str:
        """Return the rule set's name (how messages and command lines name it)."""
        return self.name


_PR53324 = RuleSet(
    name=PR53324, predecessor=LEGACY, engine="vLLM PR #53324",
    store=STORE_PR53324, tail_key=TAIL_STORED, config=CONFIG_KVSPEC, lookahead=0,
    deltas=(Delta(what="the tail block is loaded under H_{B_g}, the boundary it was stored at: h if stored, "
                       "else the smallest stored unit boundary after h inside the tail block",
                  where="MooncakeStoreWorker._tail_key_boundaries, TailKeyBoundary"),))

RULE_SETS: dict[str, RuleSet] = {
    # the loader before #53324 is the PR's rules with the other tail-key rule (the legacy-tail-key mutant's variant too)
    LEGACY: attrs.evolve(
        _PR53324, name=LEGACY, predecessor=None, engine="vLLM before PR #53324", tail_key=TAIL_HIT,
        deltas=(Delta(what="the tail block of a hit is loaded under H_h, the hit length's own hash",
                      where="KVCacheStoreRecvingThread._handle_request before #53324"),)),
    PR53324: _PR53324,
    VLLM_0_33: RuleSet(
        name=VLLM_0_33, predecessor=PR53324, engine="vLLM 0.33.0",
        store=STORE_VLLM_0_33, tail_key=TAIL_STORED, config=CONFIG_VLLM_0_33, lookahead=0,
        deltas=(
            Delta(what="the prompt checkpoint C is ⌊P/u⌋·u − u with EAGLE block drop, else "
                       "⌊(P − max(1, λ))/u⌋·u (never negative); every Mamba group stores its state at C",
                  where="vllm/v1/kv_cache_interface.py: get_mamba_prefill_checkpoint_position"),
            Delta(what="in fine mode every attention group publishes blocks ⌊C/L⌋·L/s … ⌈E_g/s⌉ − 1 keyed "
                       "min((i+1)·s, E_g), E_g = C + the group's EAGLE proof margin (u when s > u, else s; 0 "
                       "without EAGLE), whether or not C is a multiple of every Mamba block size",
                  where="store/scheduler.py: _partial_tail_non_mamba_puts, ReqMeta.publish_partial_tail"),
            Delta(what="replay retention keeps the Mamba states at the replay boundaries: P − 1 without EAGLE; "
                       "⌊(P−1)/L⌋·L − L and ⌊P/L⌋·L − L with EAGLE; each aligned down to a, then to b",
                  where="vllm/v1/core/kv_cache_coordinator.py: replay_boundaries; "
                        "MambaManager.reachable_block_mask"),
            Delta(what="configuration: a single group must have u = its span (the block size × D when "
                       "DCP-sharded); refused with vLLM's 'Invalid prefix_match_unit'",
                  where="vllm/v1/core/kv_cache_utils.py: resolve_kv_cache_block_sizes"),
            Delta(what="hash lookahead λ = 0 under a KV connector (the connector keeps the legacy hashes); "
                       "with λ > 0 only ⌊(n − λ)/u⌋ hashes of an n-token request exist",
                  where="vllm/config/vllm.py: VllmConfig.num_hash_lookahead_tokens; "
                        "kv_cache_utils.get_request_block_hasher"),
        )),
    VLLM_0_33_LOOKAHEAD: RuleSet(
        name=VLLM_0_33_LOOKAHEAD, predecessor=VLLM_0_33,
        engine="kvspec's proposal for vLLM's connector path (0.33.0 does it for its local prefix cache only)",
        store=STORE_VLLM_0_33, tail_key=TAIL_STORED, config=CONFIG_VLLM_0_33, lookahead=1,
        deltas=(
            Delta(what="every block hash also covers the λ = 1 token after its unit (an EAGLE-family drafter's reach; "
                       "num_speculative_tokens for multi-module MTP), on the connector path too: a key H_t names tokens "
                       "[0, t + λ), so only ⌊(n − λ)/u⌋ hashes of an n-token request exist and a stored request of S "
                       "shared tokens shows the reader only boundaries t with t + λ <= S",
                  where="vllm/config/vllm.py: VllmConfig.num_hash_lookahead_tokens (0 under a KV connector in 0.33.0)"),
            Delta(what="no EAGLE drop anywhere (checkpoint, proof margin, replay boundaries, lookup): the hash proves the "
                       "token after the boundary, the one the drafter's last position read",
                  where="vllm/v1/core/sched/scheduler.py: use_eagle_block_drop = False when lookahead hashes are on"),
        )),
    VLLM_0_34: RuleSet(
        name=VLLM_0_34, predecessor=VLLM_0_33, engine="vLLM 0.34.0",
        store=STORE_VLLM_0_33, tail_key=TAIL_STORED, config=CONFIG_VLLM_0_33, lookahead=1,
        lookahead_scope=LOOKAHEAD_DRAFTER,
        deltas=(
            Delta(what="hash lookahead on the connector path: λ = 1 when an EAGLE-family drafter (EAGLE, EAGLE3, MTP: "
                       "a group carrying the EAGLE flag) needs the block drop, else 0 (DSpark/DFlash and no drafter "
                       "keep the legacy hashes); a key H_t then names tokens [0, t + λ)",
                  where="vllm/config/vllm.py: _resolve_num_hash_lookahead_tokens; "
                        "store/connector.py: supports_lookahead_block_hashes (True from 0.34.0)"),
            Delta(what="with λ > 0 no EAGLE drop anywhere: checkpoint C = ⌊(P − λ)/u⌋·u, proof margin 0, replay "
                       "boundaries and lookup without the drop (speculative_config.disable_lookahead_block_hashes "
                       "restores 0.33.0's behaviour: --rules vllm-0.33.0)",
                  where="store/coordinator.py: use_eagle = use_eagle and not num_hash_lookahead_tokens; "
                        "drops_eagle_block"),
            Delta(what="finish-time lookahead save: when a writer that hashed with λ > 0 finishes having decoded O "
                       "tokens, its attention groups also store every whole L-block up to ⌊min(P, ⌊(P + O − λ)/u⌋·u)/L⌋·L "
                       "(the blocks whose lookahead tokens are outputs; no Mamba state, no tail key); their keys "
                       "name outputs, so only a reader that continues the conversation (S >= t + λ > P) names them",
                  where="store/scheduler.py: register_finished_lookahead_save (request_finished_all_groups), "
                        "ReqMeta.from_request_tracker (token_len = min(completed, prefill_end_tokens))"),
            Delta(what="with save_decode_cache the decode phase's Mamba states are stored too, and replay retention "
                       "(interval 0) becomes one state per scheduler block L: states at multiples of L (every block "
                       "when L <= b), in the prompt where a chunk ended and at every one in the decode phase (0.33.0: "
                       "decode attention blocks only, #56972)",
                  where="store/scheduler.py and worker.py: prefix_cache_retention_interval = block_size when "
                        "save_decode_cache and Mamba and 0; _handle_boundary_state_offloads (is_decode_boundary); "
                        "single_type_kv_cache_manager.py: reachable_block_mask (one state per segment)"),
        ), deferred_saves=True, decode_states=True),
    SGLANG_0_5_23: RuleSet(
        name=SGLANG_0_5_23, predecessor=None, engine="SGLang 0.5.23 (HiCache L3 on Mooncake)",
        store=STORE_SGLANG, tail_key=TAIL_STORED, config=CONFIG_SGLANG, lookahead=1,
        lookahead_scope=LOOKAHEAD_DRAFTER_NO_MAMBA, eagle_drop=False,
        deltas=(
            Delta(what="a hit is a whole number of pages: the prefix-match unit is the page, which is the attention "
                       "group's span (per-rank block page/D, interleave 1); Mamba states sit on a grid that is a "
                       "multiple of the page (lcm(mamba_cache_chunk_size, page))",
                  where="mem_cache/radix_cache.py: RadixKey.page_aligned; hicache_storage.py: HiCacheStorageConfig; "
                        "runtime_context.py: mamba_checkpoint_grid"),
            Delta(what="store: every whole page of the inserted tokens (no partial page, no sub-page tail); one Mamba "
                       "state per request, at the last grid point its tokens reached, keyed by that page's hash; with a "
                       "Mamba pool the insert ends at that state (no state: nothing inserted)",
                  where="unified_radix_cache.py: checkpoint_into_tree (the components' smallest length); "
                        "unified_tree_core.py: build_storage_backup_spec; cache_controller.py: _page_backup; "
                        "components/mamba.py: MambaComponent.build_hicache_transfers (TRAILING_PAGES, keys "
                        "[node.hash_value[-1]]); prepare_for_caching_req (mamba_last_track_seqlen)"),
            Delta(what="lookup: the largest page count, below the prompt's last token, whose KV pages all exist and "
                       "whose Mamba state exists, on every rank (a MIN over per-rank flags); the load keys are the "
                       "hit's own page hashes (always stored); no EAGLE drop",
                  where="mooncake_store.py: MooncakeStore.batch_exists_v2; hybrid_cache_controller.py: "
                        "_storage_hit_query, _sync_prefetch_hit_query, _sync_trailing_keys; "
                        "schedule_batch.py: _compute_max_prefix_len"),
            Delta(what="EAGLE without a Mamba group: bigram page keys, page k hashing the pairs (t_i, t_i+1), so a key "
                       "names the token after its page (λ = 1 on every pool); with a Mamba group bigram keys are off "
                       "(λ = 0) while the draft pool is still stored under the plain page hash",
                  where="hash_binding.cpp: fill_bigram_page; unified_tree_core.py: is_eagle = params.is_eagle and "
                        "ComponentType.MAMBA not in components; base_spec_worker.py: _build_hicache_draft_plan"),
            Delta(what="configuration: DCP > 1 allows no EAGLE-family speculation (DSPARK only), one MLA KV pool and "
                       "optional Mamba/KDA state, interleave 1",
                  where="arg_groups/hicache_hook.py: resolve_hicache_dcp_compatibility; cache_controller.py: "
                        "HiCacheController.attach_storage_backend"),
        )),
    SGLANG_0_5_23_BIGRAM: RuleSet(
        name=SGLANG_0_5_23_BIGRAM, predecessor=SGLANG_0_5_23,
        engine="kvspec's proposal for SGLang: bigram keys for Mamba hybrids too",
        store=STORE_SGLANG, tail_key=TAIL_STORED, config=CONFIG_SGLANG, lookahead=1,
        lookahead_scope=LOOKAHEAD_DRAFTER, eagle_drop=False,
        deltas=(Delta(what="bigram page keys whenever an EAGLE-family drafter is on, Mamba groups or not: a page key "
                           "names the token after the page, the one the draft pool's last row read (closes the "
                           "draft-KV hazard: CONTENT-KEY, λ = 1 >= the drafter's reach)",
                      where="unified_tree_core.py: is_eagle = params.is_eagle (drop 'and ComponentType.MAMBA not in "
                            "components'); rust_tree_core/adapter.py likewise"),)),
}

DEFAULT_RULES = VLLM_0_34  # the newest shipped rule set
LEGACY_SWITCH_RULES = LEGACY  # the rule set the legacy switch names (scenario JSON "legacy": true, --legacy-tail-key)


def get_rules(name: str) -> RuleSet:
    """Return the named rule set; raise SpecError naming the known ones otherwise."""
    if not isinstance(name, str) or name not in RULE_SETS:
        raise SpecError(RULE_RULES, f"unknown rule set {name!r} (known: {', '.join(RULE_SETS)})")
    return RULE_SETS[name]


def coerce_rules(rules: RuleSet | str) -> RuleSet:
    """Return the rule set itself, else the named one (get_rules): a value's field may be given by name."""
    return rules if isinstance(rules, RuleSet) else get_rules(rules)


def coerce_optional_rules(rules: RuleSet | str | None) -> RuleSet | None:
    """Return None for None, else coerce_rules(rules)."""
    return None if rules is None else coerce_rules(rules)


def compute_lookahead(rules: RuleSet, geometry: Geometry) -> int:
    """Return λ of a rule set on a geometry: 0 for a rule set without lookahead; with an EAGLE-family drafter its reach
    (1 for EAGLE, EAGLE3, MTP; K for K-module MTP: vLLM's num_prefill_lookahead_tokens) under every or the drafter
    scope, rules.lookahead (SGLang's one-token bigram) without Mamba under the bigram scope; without a drafter
    rules.lookahead under every scope, else 0."""
    eagle = has_eagle(geometry)
    if rules.lookahead == 0:
        return 0
    if rules.lookahead_scope == LOOKAHEAD_DRAFTER_NO_MAMBA:
        return rules.lookahead if eagle and all(g.kind != "mamba" for g in geometry.groups) else 0
    if eagle:
        return max(rules.lookahead, geometry.draft_reach)
    return rules.lookahead if rules.lookahead_scope == LOOKAHEAD_ALWAYS else 0


@functools.lru_cache(maxsize=4096)  # pure over frozen values: one geometry per (rule set, geometry)
def compute_rule_geometry(rules: RuleSet, geometry: Geometry) -> Geometry:
    """Return the geometry a rule set's store rule and lookup run on: with hash lookahead (λ > 0) or a rule set without
    the EAGLE drop no group takes the drop (the hash covers the drafter's next token), so the EAGLE flags (and the
    drafter's reach, already in λ) are cleared; else the geometry."""
    if not any(g.eagle for g in geometry.groups) or (rules.eagle_drop and compute_lookahead(rules, geometry) == 0):
        return geometry
    return attrs.evolve(geometry, groups=tuple(attrs.evolve(g, eagle=False) for g in geometry.groups), draft_reach=1)


def compute_lineage(rules: RuleSet) -> tuple[RuleSet, ...]:
    """Return the rule set and its predecessors, oldest first."""
    out = [rules]
    while out[-1].predecessor is not None:
        out.append(RULE_SETS[out[-1].predecessor])
    return tuple(reversed(out))


def check_config(rules: RuleSet, geometry: Geometry) -> None:
    """Raise SpecError for a geometry the rule set's engine refuses (vLLM 0.33.0: one group needs u = its span;
    SGLang 0.5.23: check_sglang_config)."""
    if rules.config == CONFIG_SGLANG:
        check_sglang_config(geometry)
    if rules.config != CONFIG_VLLM_0_33 or len(geometry.groups) != 1:
        return
    check_single_group_unit(geometry.unit, compute_span(geometry, GroupId(0)))


def check_sglang_config(geometry: Geometry) -> None:
    """Raise SpecError unless SGLang 0.5.23's HiCache L3 runs the geometry: one page (every attention span equal),
    every Mamba block a multiple of it (the checkpoint grid), replay retention (one state per request), and under DCP
    no EAGLE flag, one attention group, interleave 1. Hits are then whole pages: every object it stores ends a page."""
    d = geometry.parallel.dcp
    spans = {compute_span(geometry, GroupId(i)) for i, g in enumerate(geometry.groups) if g.kind == "attention"}
    if len(spans) != 1:
        raise SpecError(RULE_SGLANG_PAGE, f"SGLang's L3 object is one page for every pool: give one attention span "
                                          f"(block × D), got {sorted(spans) or 'none'} (HiCacheStorageConfig)")
    page = spans.pop()
    for g in geometry.groups:
        if g.kind == "mamba" and g.block_size % page:
            raise SpecError(RULE_SGLANG_GRID, f"SGLang keeps Mamba states on lcm(mamba chunk, page): a Mamba block of "
                                              f"{g.block_size} is not a multiple of the page {page} "
                                              f"(mamba_checkpoint_grid)")
    if geometry.retention != "replay":
        raise SpecError(RULE_SGLANG_RETENTION, "SGLang keeps one Mamba state per request (at its last grid point): "
                                               "use --retention replay")
    if d > 1 and has_eagle(geometry):
        raise SpecError(RULE_SGLANG_DCP, "HiCache with --dcp-size > 1 only supports DSPARK speculative decoding: no "
                                         "EAGLE-flagged group under DCP (resolve_hicache_dcp_compatibility)")
    if d > 1 and sum(g.kind == "attention" for g in geometry.groups) > 1:
        raise SpecError(RULE_SGLANG_DCP, "HiCache L3 under DCP stores one MLA KV pool and optional Mamba/KDA state "
                                         "(attach_storage_backend): one attention group")
    if d > 1 and geometry.parallel.interleave != 1:
        raise SpecError(RULE_SGLANG_DCP, "SGLang's DCP layout interleaves single tokens (interleave 1) "
                                         "(layers/dcp/layout.py)")


def check_single_group_unit(unit: int, span: int) -> None:
    """Raise SpecError unless u = the span, what vLLM 0.33.0 asks of a model with a single KV-cache group."""
    if unit != span:
        raise SpecError(RULE_VLLM_UNIT,
                        f"vLLM 0.33.0 refuses prefix_match_unit={unit} with a single KV cache group: hits land on "
                        f"the block size ({span}); unset it or set it to {span} (resolve_kv_cache_block_sizes)")
