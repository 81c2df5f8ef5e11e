"""Each vLLM release's rule set against that release's own code (marker ``vllm``; runs in a vLLM venv).

`make test` runs this module once per release, with the interpreter of ``.venv-vllm`` (0.33.0) and of
``.venv-vllm-0.34.0`` (vllm installed from its wheel without its dependency tree); the main run deselects it.
Every test compares the installed release with its own rule set (checks/rulesets.py: the row whose oracle
names it); numbers that differ between releases are tabled per rule set. Under CI a missing vllm fails.
"""

from __future__ import annotations

import random

import attrs
import pytest

from kvspec.spec.keys import StoreKey, render_key_vllm
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario

from .conftest import require

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def v():
    require("vllm")
    from kvspec.checks.conform.vllm_oracle import load_vllm
    return load_vllm()


@pytest.fixture(scope="module")
def rules(v):
    """The rule set whose oracle is the installed vLLM release."""
    from kvspec.checks.rulesets import find_oracle_rules
    found = find_oracle_rules("vllm", v.release.version)
    assert found is not None, v.release.version
    return found


# the worked example per release: stored objects, hit, tails (0.34.0: lookahead keys, no EAGLE drop)
WORKED = {"vllm-0.33.0": ([(0, 12288), (0, 14976), (1, 14848)], 14848, ((0, 14976), (1, 14848))),
          "vllm-0.34.0": ([(0, 12288), (0, 14976), (1, 13824), (1, 14976)], 14976, ((0, 14976), (1, 14976)))}


def kimi(rules: str = "vllm-0.33.0", prompt: int = 15000) -> Scenario:
    return Scenario(geometry=get_preset("kimi-k3-dcp8"), prompt=prompt,
                    stored=(StoredRequest(prompt=prompt, shared=prompt),), rules=rules)


def test_worked_example_is_what_vllm_does(v, rules):
    from kvspec.checks.conform.vllm_oracle import compute_answer
    ans = compute_answer(kimi(rules), v)
    stored, hit, tails = WORKED[rules]
    assert ans.refused is None
    assert sorted(ans.stored) == stored
    assert ans.hit == hit and ans.tails == tails
    assert len(ans.load_keys) == 3 * 8  # attention blocks 0 and 1, Mamba block 9, on each of 8 ranks
    out = evaluate_scenario(kimi(rules))
    assert (out.hit_length, out.tails, sorted(out.present)) == (ans.hit, ans.tails, stored)


@pytest.mark.parametrize("seed", [0, 1])
def test_conformance_on_generated_scenarios(v, rules, seed):
    """Every field agrees on 2,000 generated scenarios per seed plus the worked examples (target 100%)."""
    from kvspec.checks.conform.runner import FIELDS, format_report, run_conformance
    rep = run_conformance(2000, seed, rules=rules)
    assert rep["rules"] == rules and rep["vllm"] == v.release.version
    print(format_report(rep))
    assert rep["cases"] == 2002
    assert rep["compared"]["stored"] >= 1400  # most generated geometries are accepted by both
    for f in FIELDS:
        assert rep["agree"][f] == rep["compared"][f], (f, rep["disagreements"])


def test_the_comparison_can_fail(v):
    """The PR's rule set stores other objects than the release, the legacy one also loads other keys: both are
    caught (test_every_field_and_every_ranks_keys_can_fail feeds wrong answers field by field and rank by rank)."""
    from kvspec.checks.conform.runner import Case, compare_case
    pr = compare_case(Case(scenario=kimi("pr53324"), geometry_args={}, spec_error=None), v)
    assert pr["stored"] is False and pr["hit"] is False
    legacy = compare_case(Case(scenario=kimi("legacy"), geometry_args={}, spec_error=None), v)
    assert legacy["stored"] is False and legacy["load_keys"] is False


def test_every_field_and_every_ranks_keys_can_fail(v, rules, monkeypatch):
    """The comparison's power, field by field: vLLM's answer with one field made wrong — one stored object dropped,
    the hit one unit off, a tail moved, one key of any single rank (not only rank 0) replaced — is caught on that
    field, and only there."""
    import kvspec.checks.conform.runner as runner
    import kvspec.checks.conform.vllm_oracle as oracle
    from kvspec.checks.conform.runner import Case, compare_case
    case = Case(scenario=kimi(rules), geometry_args={}, spec_error=None)
    assert all(compare_case(case, v).values())
    real = oracle.compute_answer(case.scenario, v)
    ranks = sorted({r for r, _ in real.load_keys})
    assert len(ranks) == 8
    wrongs = {"stored": [attrs.evolve(real, stored=frozenset(sorted(real.stored)[1:]))],
              "hit": [attrs.evolve(real, hit=real.hit - 128)],
              "tails": [attrs.evolve(real, tails=((real.tails[0][0], real.tails[0][1] - 128), *real.tails[1:]))],
              "load_keys": [attrs.evolve(real, load_keys=tuple((r, k + "x" if r == bad and i == j else k)
                                                              for j, (r, k) in enumerate(real.load_keys)))
                            for bad in ranks for i in (next(j for j, (r, _) in enumerate(real.load_keys) if r == bad),)]}
    for field, answers in wrongs.items():
        for wrong in answers:
            monkeypatch.setattr(runner, "compute_answer", lambda sc, v_, w=wrong: w)  # where compare_case reads it
            res = compare_case(case, v)
            assert res[field] is False and all(ok for f, ok in res.items() if f != field), (field, res)


def test_refusals_match_vllms_reasons(v, rules):
    from kvspec.checks.conform.vllm_oracle import Engine, Refused
    from kvspec.spec.errors import SpecError
    from kvspec.spec.geometry import make_geometry
    for groups, unit, dcp in ([("attention", 16, False)], 4, 1), ([("mamba", 16, False)], 4, 2), \
            ([("attention", 16, False)], 8, 2):
        g = make_geometry(unit, groups, dcp=dcp)
        with pytest.raises(Refused, match="Invalid prefix_match_unit"):
            Engine(g, v)
        with pytest.raises(SpecError) as ei:
            Scenario(geometry=g, prompt=40, stored=(), rules=rules)
        assert ei.value.rule == "vllm-prefix-match-unit"
        Scenario(geometry=g, prompt=40, stored=(), rules="pr53324")  # the PR's rule set accepts it
    # With DCP, vLLM's unit need only divide the span b·D: a lone attention group under DCP 2 with b = 16 hashes every
    # 32 tokens, and kvspec accepts it too (it required u | b until session 19)
    lone = make_geometry(32, [("attention", 16, False)], dcp=2)
    assert Engine(lone, v).lcm == 32
    Scenario(geometry=lone, prompt=40, stored=(), rules=rules)


def test_vllm_key_grammar_renders_as_vllm(v):
    rng = random.Random(5)
    alphabet = "ab@%:-_0"
    for _ in range(300):
        k = StoreKey(model="".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))),
                     tp_rank=rng.randint(0, 15), pcp_rank=rng.randint(0, 3), dcp_rank=rng.randint(0, 15),
                     pp_rank=rng.randint(0, 3), group=rng.randint(0, 4), hash_hex=f"{rng.getrandbits(256):064x}",
                     cache_prefix=rng.choice(["", "bf16", "a@b", "x%40"]))
        meta = v.keys.KeyMetadata(model_name=k.model, tp_rank=k.tp_rank, pcp_rank=k.pcp_rank, dcp_rank=k.dcp_rank,
                                  pp_rank=k.pp_rank, group_id=k.group, cache_prefix=k.cache_prefix)
        assert v.keys.PoolKey(meta, k.hash_hex).to_string() == render_key_vllm(k)


def test_vllm_key_grammar_is_not_injective(v):
    """Two different field tuples, one string, in vLLM's own rendering (kvspec's escaped grammar keeps them apart)."""
    from kvspec.spec.keys import render_key
    h = "ab" * 32
    a = StoreKey(model="m", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex=h, cache_prefix="a")
    b = attrs.evolve(a, model="a@m", cache_prefix="")
    as_vllm = [v.keys.PoolKey(v.keys.KeyMetadata(model_name=k.model, tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0,
                                                 group_id=0, cache_prefix=k.cache_prefix), h).to_string() for k in (a, b)]
    assert as_vllm[0] == as_vllm[1] == f"a@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{h}"
    assert render_key(a) != render_key(b)
    # the store namespace is appended to the model name with no separator: a second collision
    m1 = v.keys.KeyMetadata(model_name="mX", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0)
    m2 = v.keys.KeyMetadata(model_name="m", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, store_namespace="X")
    assert v.keys.PoolKey(m1, h).to_string() == v.keys.PoolKey(m2, h).to_string()


def test_vllm_as_an_engine_adapter(v, rules):
    """The release under the adapter protocol: conforms to its rule set on the vectors and a search, not to the PR's."""
    from kvspec.checks.conform.adapters import EngineAdapter, run_adapter_conformance
    from kvspec.checks.conform.vllm_oracle import VLLM
    assert isinstance(VLLM, EngineAdapter)
    rep = run_adapter_conformance(VLLM, rules, examples=50)
    assert rep["ok"] and rep["vectors"] >= 600 and not rep["uncovered_claims"], rep["vector_disagreements"][:2]
    axes = rep["coverage"]["axes"]  # vLLM's own code over the whole space: D to 64, interleave, PCP, N > 128k
    assert {"16", "32", "64"} <= set(axes["dcp"]) and "I>1" in axes["interleave"] and "PCP>1" in axes["pcp"]
    assert rep["coverage"]["boundary"]["N > 131072"][0] >= 50
    rep = run_adapter_conformance(VLLM, "pr53324", examples=0, stop_after=5)
    assert not rep["ok"] and len(rep["vector_disagreements"]) == 5 and rep["stopped_early"]


def test_from_vllm_mapping_agrees_with_vllms_resolution(v):
    """--from-vllm accepts a configuration iff vLLM's resolve_kv_cache_block_sizes does, with vLLM's scheduler block L
    and hash unit u (units dividing b·D but not b included)."""
    from types import SimpleNamespace

    from kvspec.checks.conform.vllm_config import compute_geometry_from_vllm
    from kvspec.checks.conform.vllm_oracle import Engine, Refused
    from kvspec.spec.errors import SpecError
    from kvspec.spec.geometry import compute_lcm_span
    seen = {"agree": 0, "refused": 0, "unit past the block": 0}
    for kinds in (["attention"], ["attention", "mamba"], ["attention", "attention", "mamba"]):
        for block, mamba, dcp, unit in ((b, m, d, u) for b in (4, 8, 16) for m in (4, 8, 24) for d in (1, 2, 4)
                                        for u in (None, 2, 4, 8, 12, 16, 32)):
            cfg = {"block_size": block, "mamba_block_size": mamba, "decode_context_parallel_size": dcp,
                   "prefix_match_unit": unit, "kv_cache_groups": kinds}
            groups = tuple(SimpleNamespace(kind=k, block_size=block if k == "attention" else mamba, eagle=False)
                           for k in kinds)
            raw = SimpleNamespace(unit=unit, groups=groups, parallel=SimpleNamespace(dcp=dcp, pcp=1),
                                  retention="replay")
            try:
                eng = Engine(raw, v)
            except Refused:
                eng = None
            try:
                g = compute_geometry_from_vllm(cfg).geometry
            except SpecError as exc:
                assert eng is None, (cfg, str(exc))
                seen["refused"] += 1
                continue
            assert eng is not None, cfg
            assert (eng.lcm, eng.unit) == (compute_lcm_span(g), g.unit), cfg
            seen["agree"] += 1
            seen["unit past the block"] += any(x.block_size % g.unit for x in g.groups)
    assert min(seen.values()) > 20, seen


def test_vllm_leaves_a_loadable_hit_after_the_rederivation(v, rules):
    """The BEST/vllm-0.33.0 finding is vLLM's own behaviour: with attention key 5 lost, vLLM's lookup answers 0 although
    [0, 5) is loadable (attention blocks 2, 4 and the block key 6 = N; both Mamba groups hold a state at 5)."""
    from kvspec.checks.conform.vllm_oracle import compute_answer
    from kvspec.spec.geometry import make_geometry
    g = make_geometry(1, [("attention", 2, False), ("mamba", 2, False), ("mamba", 3, False)], retention="dense")
    sc = Scenario(geometry=g, prompt=6, stored=(StoredRequest(prompt=6, shared=6),), evicted=frozenset({(0, 5, 0)}),
                  rules=rules)
    ans = compute_answer(sc, v)
    assert ans.hit == 0 == evaluate_scenario(sc).hit_length
    assert {(0, 2), (0, 4), (0, 6), (1, 5), (2, 5)} <= ans.stored


def test_vllm_hit_rises_when_a_mamba_state_is_evicted(v, rules):
    """The MONO-EVICT/vllm-0.33.0 finding is vLLM's own behaviour: a reader of the first 4 tokens of a 5-token request
    hits 0 (the state at 4 sends the lookup to N − 1, where no attention key is left), and 3 once that state is gone."""
    from kvspec.checks.conform.vllm_oracle import compute_answer
    from kvspec.spec.geometry import make_geometry
    g = make_geometry(1, [("attention", 4, False), ("mamba", 3, False)])
    base = Scenario(geometry=g, prompt=4, stored=(StoredRequest(prompt=5, shared=4),), rules=rules)
    evicted = Scenario(geometry=g, prompt=4, stored=base.stored, evicted=frozenset({(1, 4, 0)}), rules=rules)
    assert compute_answer(base, v).hit == 0 == evaluate_scenario(base).hit_length
    assert compute_answer(evicted, v).hit == 3 == evaluate_scenario(evicted).hit_length


@pytest.mark.parametrize("algo,lookahead,salt", [("sha256", 0, None), ("sha256", 1, None), ("sha256_cbor", 0, "s1"),
                                                 ("sha256", 2, "tenant-7")])
def test_keys_check_maps_a_dump_rendered_by_vllm(v, algo, lookahead, salt):
    """`kvspec keys check` reads a key dump vLLM itself rendered: block hashes from vLLM's request block hasher with
    its configured hash function (a Request stand-in carrying only token ids and the salt), keys from its PoolKey."""
    import types

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    from kvspec.checks.cli.keys_tool import compute_engine_chain, compute_key_report
    from kvspec.checks.conform.vllm_oracle import Engine
    from kvspec.spec.presets import get_preset
    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)
    tokens = [(31 * i + 7) % 50_000 for i in range(15_000)]
    g = get_preset("kimi-k3-dcp8")
    req = types.SimpleNamespace(block_hashes=[], num_tokens=len(tokens), mm_features=[], all_token_ids=tokens,
                                lora_request=None, cache_salt=salt, prompt_embeds=None, _all_token_ids=tokens)
    chain = list(kv_cache_utils.get_request_block_hasher(g.unit, fn, lookahead)(req))
    assert chain == list(compute_engine_chain(tokens, g.unit, algo, None, salt, lookahead))
    eng = Engine(g, v)
    stored = eng.store_objects(len(tokens), chain)
    keys = [eng.key(r, gid, chain, t) for gid, t in sorted(stored) for r in eng.ranks]
    rules = "vllm-0.33.0" if lookahead == 0 else "vllm-0.33.0-lookahead"
    if lookahead > 1:  # λ = 2 is no rule set of kvspec's: map the hashes only
        rep = compute_key_report(g, keys, "vllm-0.33.0")
        assert rep["complete_objects"] == len(stored)
        return
    rep = compute_key_report(g, keys, "vllm-0.33.0", tokens, rules, hash_algo=algo, cache_salt=salt)
    assert rep["unmatched_hashes"] == 0 and rep["bad_lines"] == [] and not rep["warnings"]
    assert {(o["group"], o["boundary"]) for o in rep["objects"]} == set(stored)
    assert rep["outcome"]["hit_length"] > 0 and all(e["present"] for e in rep["outcome"]["load"])


def test_the_docs_conform_vllm_blocks_print_what_they_show(v):
    """The `$ .venv-vllm…/bin/kvspec …` blocks of the docs for this release's venv (tests/test_docs.py checks the
    others)."""
    import os
    import shlex
    import subprocess
    import sys

    from .test_docs import ROOT, compare_block, iterate_blocks
    venv = ".venv-vllm" if v.release.version == "0.33.0" else f".venv-vllm-{v.release.version}"
    blocks = iterate_blocks(f"$ {venv}/bin/kvspec ")
    assert blocks
    for path, line, cmd, expected in blocks:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-m", "kvspec.checks", *shlex.split(cmd)[1:]], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
        why = compare_block(expected, r.stdout)
        assert why is None, f"{path}:{line} `{cmd}` drifted: {why}\n{r.stdout}"


def test_lookahead_hashes_are_granted_exactly_to_the_drafters_whose_draft_kv_reads_the_next_token(v):
    """vLLM 0.34.0's own code decides, per speculative method, λ on the connector path: 1 for EAGLE, EAGLE3 and MTP,
    0 for DSpark and DFlash — vLLM's needs_eagle_block_drop says their draft KV comes from the target's hidden state
    alone — although every one of them reads one prefill token ahead (num_prefill_lookahead_tokens = 1, a scheduling
    margin, not a hash reach). kvspec's EAGLE flag is exactly vLLM's needs_eagle_block_drop (the `drafter` axis of
    checks/conform/coverage.py: `eagle` vs `draft-no-drop`), so the draft-KV hazard is closed for every method under 0.34.0."""
    if not v.release.resolves_hash_lookahead:
        pytest.skip("hash lookahead on the connector path exists from vLLM 0.34.0 (this venv is an earlier release)")
    import types

    from vllm.config.speculative import SpeculativeConfig
    from vllm.config.vllm import VllmConfig
    from vllm.v1.worker.gpu.spec_decode.speculator_config import get_method_config_class
    for method, lam in (("eagle", 1), ("eagle3", 1), ("mtp", 1), ("dspark", 0), ("dflash", 0)):
        spec = types.SimpleNamespace(method=method, custom_method=None, draft_model_config=None,
                                     num_speculative_tokens=1, disable_lookahead_block_hashes=False,
                                     disable_eagle_block_drop=False)
        for name in ("use_eagle_block_drop", "needs_eagle_block_drop", "use_eagle", "use_dflash", "use_dspark"):
            setattr(spec, name, types.MethodType(getattr(SpeculativeConfig, name), spec))  # vLLM's own decisions
        spec.speculator_config = get_method_config_class(spec)(spec)
        kv = types.SimpleNamespace(kv_connector="MooncakeStoreConnector", kv_role="kv_both",
                                   kv_connector_extra_config={}, kv_connector_module_path=None)
        cfg = types.SimpleNamespace(speculative_config=spec, kv_transfer_config=kv,
                                    cache_config=types.SimpleNamespace(enable_prefix_caching=True))
        cfg.num_prefill_lookahead_tokens = VllmConfig.num_prefill_lookahead_tokens.fget(cfg)
        assert cfg.num_prefill_lookahead_tokens == 1, method
        assert VllmConfig._resolve_num_hash_lookahead_tokens(cfg) == lam, method


# ---------------------------------------------------------------- the lifecycle: vLLM's real scheduler


def test_lifecycle_conformance_on_generated_scenarios(v, rules):
    """kvspec's schedule (spec/schedule.py) against the release's real Scheduler, KV-cache manager and every rank's
    transfer threads: chunk ends, objects stored per rank, hit, tails, every rank's load keys, 300 generated cases
    (budgets 256..65536, both retentions, EAGLE, prefill checkpoint blocks) plus issue 29's Kimi-like cases."""
    from kvspec.checks.conform.vllm_lifecycle import format_lifecycle_report, run_lifecycle_conformance
    rep = run_lifecycle_conformance(300, seed=0, rules=rules)
    compared = rep["cases"] - rep["kinds"]["stalled (not compared)"]
    assert rep["cases"] >= 300 and all(rep["compared"][f] == compared for f in ("refusal", "hit"))
    assert rep["kinds"]["concurrent"] >= 60 and rep["kinds"]["with preemption"] >= 3
    assert rep["kinds"]["with evictions"] >= 40 and rep["kinds"]["continuing a conversation"] >= 30
    assert rep["ok"], format_lifecycle_report(rep)


def test_lifecycle_concurrent_traces_need_the_junction(v, rules):
    """Concurrent requests sharing a prefix: vLLM pins the Mamba state at the shared-prefix junction it detects
    (Marconi-style), kept even under replay retention. The trace without the junction misses that state; with it,
    kvspec agrees."""
    from kvspec.checks.conform.vllm_lifecycle import LifecycleCase, compute_lifecycle_answer, compute_spec_lifecycle
    from kvspec.spec.geometry import Geometry, Group, Parallel
    from kvspec.spec.schedule import Schedule
    g = Geometry(unit=128, groups=(Group(kind="attention", block_size=384), Group(kind="mamba", block_size=384)),
                 parallel=Parallel(dcp=1), retention="replay")
    # the second request shares 6000 of 9000 tokens with the first: vLLM pins the junction at 5760
    case = LifecycleCase(geometry=g, schedule=Schedule(budget=2048), requests=((9000, 9000), (9000, 6000)),
                         lookup=9000)
    theirs = compute_lifecycle_answer(g, case.schedule, case.requests, case.lookup, v=v)
    assert 5760 in theirs.junctions[1] and not any(theirs.junctions[0])
    without = compute_spec_lifecycle(case, rules, theirs.chunk_ends, (), theirs.starts)
    with_j = compute_spec_lifecycle(case, rules, theirs.chunk_ends, theirs.junctions, theirs.starts)
    assert without.stored != theirs.stored and with_j.stored == theirs.stored


# the Mamba states vLLM's engine stores for P = 30000 on the Kimi-like geometry, per budget: under 0.33.0's EAGLE drop
# the replay point 12288 exists only when a chunk ends there; under 0.34.0 (lookahead, no drop) the replay point
# 29184 is the last cacheable block end, where every schedule stops
LIFECYCLE_P30000 = {"vllm-0.33.0": {32768: [29824], 2048: [12288, 29824]},
                    "vllm-0.34.0": {32768: [29184, 29952], 2048: [29184, 29952]}}


def test_lifecycle_oracle_sees_the_schedule(v, rules):
    """P = 30000 on the Kimi-like geometry under budgets 32768 and 2048: vLLM's engine and kvspec store the same
    Mamba states, the ones tabled above."""
    from kvspec.checks.conform.vllm_lifecycle import LifecycleCase, compare_lifecycle, compute_lifecycle_answer
    from kvspec.spec.schedule import Schedule
    g = get_preset("kimi-k3-dcp8")
    for budget, states in LIFECYCLE_P30000[rules].items():
        ans = compute_lifecycle_answer(g, Schedule(budget=budget), ((30000, 30000),), 30000, v=v)
        assert sorted({t for gid, t, _ in ans.stored if gid == 1}) == states
        case = LifecycleCase(geometry=g, schedule=Schedule(budget=budget), requests=((30000, 30000),), lookup=30000)
        assert all(compare_lifecycle(case, rules, v).values())


def test_lifecycle_comparison_can_fail(v, rules):
    """The lifecycle oracle has power: kvspec under the block schedule (a Mamba state at every block end, the model
    before issue 29) disagrees with vLLM's scheduler on some of the same cases, per field."""
    from kvspec.checks.conform.vllm_lifecycle import (
        compute_case_answer,
        compute_spec_lifecycle,
        iterate_lifecycle_cases,
    )
    from kvspec.spec.schedule import BLOCK_SCHEDULE
    bad = {"stored": 0, "hit": 0}
    for case in iterate_lifecycle_cases(60, seed=0):
        if not case.derives():
            continue
        theirs = compute_case_answer(case, v)  # the case's decode and save_decode_cache, as kvspec reads them
        mine = compute_spec_lifecycle(case, rules, evicted=theirs.evicted)
        block = compute_spec_lifecycle(attrs.evolve(case, schedule=BLOCK_SCHEDULE), rules, evicted=theirs.evicted)
        assert (mine.stored, mine.hit) == (theirs.stored, theirs.hit)
        bad["stored"] += block.stored != theirs.stored
        bad["hit"] += block.hit != theirs.hit
    assert bad["stored"] > 0 and bad["hit"] > 0, bad


# what a writer of P = 512 (u = b = 128, EAGLE) stores past its prefill's save once it decoded O tokens, as seen by a
# reader continuing its conversation through its first output (S = 513): under 0.34.0's lookahead keys the attention
# block ending at P is stored at finish (its hash needed the first output); under dense retention the Mamba state at P
# too, but only when a decode step ran after that hash appeared (O >= 2); 0.33.0 (λ = 0) stored both with its prefill
DEFERRED = {"vllm-0.33.0": {("dense", 1): {(0, 512), (1, 512)}, ("dense", 2): {(0, 512), (1, 512)},
                            ("replay", 2): {(0, 512)}},
            "vllm-0.34.0": {("dense", 1): {(0, 512)}, ("dense", 2): {(0, 512), (1, 512)}, ("replay", 2): {(0, 512)}}}


def test_deferred_saves_are_vllms(v, rules, monkeypatch):
    """The saves a writer's outputs unlock (vLLM 0.34.0's register_finished_lookahead_save at finish; the Mamba state
    a dense-retention core caches once its hash exists) on the release's real scheduler: the objects at P tabled above,
    and kvspec agrees per field — while the rule set without its deferred saves disagrees on every case under 0.34.0."""
    from kvspec.checks.conform.vllm_lifecycle import LifecycleCase, compare_answers, compute_case_answer
    from kvspec.spec import rules as rule_sets
    from kvspec.spec.geometry import Geometry, Group, Parallel
    from kvspec.spec.schedule import Schedule
    blind, without = 0, f"{rules}-without-deferred-saves"
    monkeypatch.setitem(rule_sets.RULE_SETS, without, attrs.evolve(rule_sets.RULE_SETS[rules], name=without,
                                                                   deferred_saves=False))
    for (retention, decode), at_p in DEFERRED[rules].items():
        g = Geometry(unit=128, groups=(Group(kind="attention", block_size=128, eagle=True),
                                       Group(kind="mamba", block_size=128)),
                     parallel=Parallel(dcp=2), retention=retention)
        case = LifecycleCase(geometry=g, schedule=Schedule(budget=256), requests=((512, 513),), lookup=560,
                             decode=decode)
        theirs = compute_case_answer(case, v)
        assert {(gid, t) for gid, t, _ in theirs.stored if t == 512} == at_p, (retention, decode)
        assert all(compare_answers(case, rules, theirs).values()), (retention, decode)
        blind += not compare_answers(case, without, theirs)["stored"]
    assert blind == (3 if rules == "vllm-0.34.0" else 0)


# save_decode_cache, u = 32, b = 64, D = 2 (L = 128), P = 300 decoding 200, a reader continuing through all of it:
# (attention boundaries past 256, Mamba boundaries) vLLM's real scheduler stores — the decode phase's attention blocks
# under both releases, its Mamba states only under 0.34.0 (replay retention then keeps one per L)
DECODE_CACHE = {"vllm-0.33.0": {"replay": ([288, 384], [256, 288]), "dense": ([288, 384], [128, 256, 288])},
                "vllm-0.34.0": {"replay": ([288, 384], [128, 256, 288, 384]),
                                "dense": ([288, 384], [128, 256, 288, 320, 384, 448])}}


def test_save_decode_cache_is_vllms(v, rules):
    """kv_connector_extra_config save_decode_cache on the release's real scheduler: the objects tabled above, kvspec
    equal per field (chunk ends, stored, hit, tails, every rank's load keys), and kvspec told the writer did not save
    its decode phase disagrees on stored and hit."""
    from kvspec.checks.conform.vllm_lifecycle import LifecycleCase, compare_answers, compute_case_answer
    from kvspec.spec.geometry import Geometry, Group, Parallel
    from kvspec.spec.schedule import Schedule
    for retention, (att, mamba) in DECODE_CACHE[rules].items():
        g = Geometry(unit=32, groups=(Group(kind="attention", block_size=64), Group(kind="mamba", block_size=64)),
                     parallel=Parallel(dcp=2), retention=retention)
        case = LifecycleCase(geometry=g, schedule=Schedule(budget=128), requests=((300, 500),), lookup=520, decode=200,
                             save_decode_cache=True)
        theirs = compute_case_answer(case, v)
        objs = sorted({(gid, t) for gid, t, _ in theirs.stored})
        assert ([t for x, t in objs if x == 0 and t > 256], [t for x, t in objs if x == 1]) == (att, mamba), retention
        assert all(compare_answers(case, rules, theirs).values()), retention
        blind = compare_answers(attrs.evolve(case, save_decode_cache=False), rules, theirs)
        assert not blind["stored"], retention


@pytest.mark.parametrize("method, modules", [("eagle", 1), ("eagle3", 1), ("mtp", 1), ("mtp", 2), ("mtp", 3),
                                             ("dspark", 1), ("dflash", 1)])
def test_lookahead_of_every_drafter_kind_is_vllms(v, rules, method, modules):
    """λ per drafter kind from the release's own code: SpeculativeConfig's use_eagle_block_drop (bound to a stand-in),
    the speculator config class vLLM picks (an MTP draft of K modules drafting K tokens specializes to
    MultiModuleMTPSpeculatorConfig: λ = num_speculative_tokens),
    VllmConfig.num_prefill_lookahead_tokens and _resolve_num_hash_lookahead_tokens — equal to kvspec's
    compute_lookahead for the geometry `--drafter` gives (0.33.0 keeps the legacy hashes: 0 for every kind)."""
    import types

    from kvspec.checks.conform.vllm_oracle import _vllm_config
    from kvspec.spec.rules import compute_lookahead, get_rules
    eagle = method in ("eagle", "eagle3", "mtp")
    g = get_preset("kimi-k3-dcp8")
    g = attrs.evolve(g, groups=tuple(attrs.evolve(x, eagle=x.eagle and eagle) for x in g.groups),
                     draft_reach=modules if eagle else 1)
    want = compute_lookahead(get_rules(rules), g)
    if not v.release.resolves_hash_lookahead:
        assert want == 0
        return
    from vllm.config.speculative import SpeculativeConfig
    from vllm.config.vllm import VllmConfig
    from vllm.v1.worker.gpu.spec_decode.speculator_config import get_speculator_config_class
    # an MTP draft checkpoint with `modules` modules (hf_config.n_predict) drafting as many tokens
    draft = types.SimpleNamespace(speculator_config_class=None,
                                  hf_config=types.SimpleNamespace(model_type="deepseek_mtp", n_predict=modules))
    spec = types.SimpleNamespace(method=method, custom_method=None, num_speculative_tokens=modules,
                                 disable_eagle_block_drop=False, disable_lookahead_block_hashes=False,
                                 index_share_for_mtp_iteration=None, draft_model_config=draft)
    for name in ("use_eagle", "needs_eagle_block_drop", "use_eagle_block_drop", "use_dflash", "use_dspark",
                 "num_mtp_modules", "use_multi_module_mtp"):
        setattr(spec, name, types.MethodType(getattr(SpeculativeConfig, name), spec))
    spec.speculator_config = get_speculator_config_class(spec)(spec)
    cfg = _vllm_config(v, g, eagle=False)  # the connector and cache stand-in; the speculative config is vLLM's here
    cfg.speculative_config = spec
    cfg.num_prefill_lookahead_tokens = VllmConfig.num_prefill_lookahead_tokens.fget(cfg)
    assert VllmConfig._resolve_num_hash_lookahead_tokens(cfg) == want == (modules if eagle else 0)


def test_lookup_deadline_and_breaker_are_vllms(v):
    """The lookup deadline and circuit breaker (spec/failure.py compute_lookup_hits) against the release's own
    LookupKeyClient.lookup and CircuitBreaker on a scripted clock: 400 random sequences of lookups (answers within or
    past the 1 s deadline, store errors, gaps short and long against the 30 s cooldown), the hit vLLM returns for each
    equal to kvspec's (its own hit, or 0 when timed out, failed or skipped by the open breaker)."""
    import types

    wmod = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker")
    if not hasattr(wmod, "LOOKUP_BREAKER_COOLDOWN_S"):
        pytest.skip(f"vLLM {v.release.version} has no lookup deadline")  # 0.33.0: a lookup waits for its answer
    from vllm.distributed.kv_transfer.kv_connector import utils as umod
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import MooncakeLookupResult

    from kvspec.spec.failure import Breaker, LookupCall, compute_lookup_hits
    clock = types.SimpleNamespace(t=0.0)
    fake_time = types.SimpleNamespace(monotonic=lambda: clock.t)

    class Scripted:  # the store's answer to the lookup just submitted: after answer_s, a hit or an error
        def __init__(self, call: LookupCall, hit: int) -> None:
            self.call, self.hit, self.callbacks = call, hit, []

        def add_done_callback(self, fn):
            self.callbacks.append(fn)

        def done(self):
            return False

        def cancel(self):
            return False  # it started: the single-worker executor runs it at once

        def result(self, timeout):
            if self.call.answer_s > timeout:
                clock.t += timeout
                raise TimeoutError("Mooncake lookup timed out")
            clock.t += self.call.answer_s
            for fn in self.callbacks:
                fn(self)
            if self.call.error:
                raise RuntimeError("store error")
            return MooncakeLookupResult(self.hit)

    rng = random.Random(11)
    breaker = Breaker(deadline_s=1.0, threshold=wmod.LOOKUP_BREAKER_FAILURE_THRESHOLD,
                      cooldown_s=wmod.LOOKUP_BREAKER_COOLDOWN_S)
    old = (wmod.time, umod.time)
    wmod.time, umod.time = fake_time, fake_time
    try:
        for _ in range(400):
            clock.t, start, calls, hits = 0.0, 0.0, [], []
            for _ in range(rng.randint(1, 12)):
                start += breaker.deadline_s + rng.choice([0.0, 0.5, 5.0, 29.0, 31.0, 60.0]) * rng.random()
                calls.append(LookupCall(start_s=start, answer_s=rng.choice([0.01, 0.4, 0.99, 1.5, 3.0]),
                                        error=rng.random() < 0.2))
                hits.append(rng.choice([0, 128, 4096]))
            client = object.__new__(wmod.LookupKeyClient)
            client._lookup_timeout_s, client._lookups, client._lookup_ttl_s = breaker.deadline_s, {}, 2.0
            client.circuit_breaker = umod.CircuitBreaker("Mooncake lookup", breaker.cooldown_s, breaker.threshold,
                                                         probe_window_s=breaker.deadline_s)
            got = []
            for k, (call, hit) in enumerate(zip(calls, hits)):
                clock.t = call.start_s
                client.executor = types.SimpleNamespace(submit=lambda fn, *a, c=call, h=hit: Scripted(c, h))
                got.append(client.lookup(f"r{k}", 100, [bytes([k]) * 32]).hit_length)
            assert tuple(got) == compute_lookup_hits(calls, hits, breaker), (calls, hits, got)
    finally:
        wmod.time, umod.time = old


def test_units_past_the_per_rank_block_are_vllms(v, rules):
    """u dividing the span b·D but not the per-rank block b (what vLLM accepts under DCP): kvspec's stored objects,
    hit, tails and every rank's load keys equal the release's own code on 300 generated scenarios (lone attention
    groups with u = b·D, hybrids with u = 2b or b·D, EAGLE, both retentions, shared prefixes)."""
    from kvspec.checks.conform.runner import Case, compare_case
    from kvspec.spec.errors import SpecError
    from kvspec.spec.geometry import Geometry, Group, Parallel
    rng = random.Random(21)
    n = 0
    while n < 300:
        d, b = rng.choice([2, 4, 8]), rng.choice([2, 4, 8, 16])
        u = b * rng.choice([k for k in (2, 4, 8) if d % k == 0])
        groups = [Group(kind="attention", block_size=b, eagle=rng.random() < 0.3)]
        if rng.random() < 0.7:
            groups.append(Group(kind="mamba", block_size=u * rng.choice([1, 2, 3])))
        try:
            g = Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=d),
                         retention=rng.choice(["replay", "dense"]))
            p = rng.randint(1, 8 * u)
            nn = rng.choice([p, rng.randint(1, 8 * u)])
            sc = Scenario(geometry=g, prompt=nn, stored=(StoredRequest(prompt=p, shared=rng.randint(0, min(p, nn))),),
                          rules=rules)
        except SpecError:
            continue  # vLLM refuses a lone group unless u is its span (checked in test_refusals_match_vllms_reasons)
        res = compare_case(Case(scenario=sc, geometry_args={}, spec_error=None), v)
        assert all(res.values()), (res, sc)
        n += 1
