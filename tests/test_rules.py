"""Rule sets as values: lineage, the deltas between pr53324 and vllm-0.33.0 pinned by minimal examples."""

from __future__ import annotations

import attrs
import pytest

from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import make_geometry
from kvspec.spec.rules import DEFAULT_RULES, RULE_SETS, compute_lineage, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.store import compute_checkpoint, compute_store_boundaries_vllm


def resend(g, p: int, rules: str):
    sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules=rules)
    return sc, evaluate_scenario(sc)


def test_registry_and_lineage():
    assert DEFAULT_RULES == "vllm-0.34.0"
    assert [r.name for r in compute_lineage(get_rules("vllm-0.34.0"))] == ["legacy", "pr53324", "vllm-0.33.0",
                                                                          "vllm-0.34.0"]
    for r in RULE_SETS.values():
        assert r.deltas and all(d.what and d.where for d in r.deltas)
    with pytest.raises(SpecError) as ei:
        get_rules("vllm-9")
    assert ei.value.rule == "rules"


def test_checkpoint_without_eagle_leaves_a_token_to_recompute():
    """(b) Without EAGLE 0.33.0's checkpoint is ⌊(P−1)/u⌋·u: 68 for P = 70, u = 2; the PR's T = 70 is never usable
    by an identical resend (capped at P − 1), which falls back to the replay state 64."""
    g = make_geometry(2, [("attention", 8, False), ("mamba", 8, False)])
    assert compute_checkpoint(g, 70) == 68
    _, pr = resend(g, 70, "pr53324")
    _, shipped = resend(g, 70, "vllm-0.33.0")
    assert (1, 70) in pr.present and pr.hit_length == 64
    assert (1, 68) in shipped.present and (0, 68) in shipped.present and shipped.hit_length == 68


def test_tail_published_when_checkpoint_is_on_the_mamba_grid():
    """(c) D = 8, u = 16, blocks 48, P = 1063: the checkpoint 1056 is a multiple of 48; 0.33.0 still publishes the
    attention tail (0, 1056) and the resend hits 1056; the PR's rule stores no tail and the resend hits 0."""
    g = make_geometry(16, [("attention", 48, False), ("mamba", 48, False)], dcp=8)
    _, pr = resend(g, 1063, "pr53324")
    _, shipped = resend(g, 1063, "vllm-0.33.0")
    assert (0, 1056) not in pr.present and pr.hit_length == 0
    assert (0, 1056) in shipped.present and shipped.hit_length == 1056


def test_eagle_proof_margin_on_the_worked_example():
    """(a) With EAGLE the attention tail is published to the checkpoint plus one unit: H_14976, and the hit is 14848."""
    from kvspec.spec.presets import get_preset
    g = get_preset("kimi-k3-dcp8")
    _, shipped = resend(g, 15000, "vllm-0.33.0")
    assert sorted(shipped.present) == [(0, 12288), (0, 14976), (1, 14848)] and shipped.hit_length == 14848
    _, pr = resend(g, 15000, "pr53324")
    assert pr.hit_length == 13824


def test_hash_lookahead_moves_the_checkpoint_and_caps_what_is_stored():
    """(d) With λ lookahead tokens per hash (0 under a connector in 0.33.0) only ⌊(P−λ)/u⌋ hashes exist."""
    g = make_geometry(2, [("attention", 8, False), ("mamba", 8, False)])
    assert compute_checkpoint(g, 70, lookahead=3) == 66
    objs = compute_store_boundaries_vllm(g, 70, lookahead=3)
    assert max(t for _, t in objs) <= 66 and (1, 66) in objs


def test_single_group_refusal_names_vllms_reason():
    g = make_geometry(4, [("attention", 16, False)])
    with pytest.raises(SpecError) as ei:
        Scenario(geometry=g, prompt=40, stored=(), rules="vllm-0.33.0")
    assert ei.value.rule == "vllm-prefix-match-unit" and "resolve_kv_cache_block_sizes" in ei.value.message
    Scenario(geometry=make_geometry(16, [("attention", 16, False)]), prompt=40, stored=(), rules="vllm-0.33.0")


def test_scenario_json_names_its_rule_set():
    from kvspec.spec.scenario import RESULT_VERSION, decode_scenario, encode_outcome
    base = {"dcp": 8, "unit": 128, "groups": [{"kind": "attention", "block_size": 1536, "eagle": True},
                                              {"kind": "mamba", "block_size": 1536}],
            "stored_prompt": 15000, "prompt": 15000}
    hits = {}
    for extra in ({}, {"rules": "pr53324"}, {"rules": "legacy"}, {"legacy": True}, {"legacy": True, "rules": "legacy"}):
        sc = decode_scenario({**base, **extra})
        d = encode_outcome(sc, evaluate_scenario(sc))
        hits[sc.rules.name] = d["hit_length"]
        assert d["rules"] == sc.rules.name and d["version"] == RESULT_VERSION == 3
    assert hits == {"vllm-0.34.0": 14976, "pr53324": 13824, "legacy": 13824}  # {}: the default rule set
    for bad, rule in (({"rules": "vllm"}, "rules"), ({"rules": ["x"]}, "rules"),
                      ({"legacy": True, "rules": "pr53324"}, "scenario")):
        with pytest.raises(SpecError) as ei:
            decode_scenario({**base, **bad})
        assert ei.value.rule == rule


def test_resend_efficiency_per_rule_set():
    """Identical resends on Kimi-K3 (1,756 lengths from L+1 to 2L−2), reusable = every whole unit below P: the PR's
    rules hit 0 on 273 and lose 19% under replay retention; vLLM 0.33.0's hit ⌊P/u⌋·u − u on every resend (all but
    the EAGLE drop's unit); lookahead keys every reusable token."""
    from kvspec.checks.bench.runner import bench_efficiency
    rows = {(r["geometry"], r["retention"], r["rules"]): r for r in bench_efficiency()}
    pr = rows[("kimi-k3-dcp8", "replay", "pr53324")]
    assert (pr["prompts"], pr["zero_hits"], pr["hit_at_1m"]) == (1756, 273, 0) and pr["reused_over_reusable"] < 0.82
    for key, r in rows.items():
        if key[2] == "vllm-0.33.0":
            assert r["zero_hits"] == 0 and (0.99 if key[0] == "kimi-k3-dcp8" else 0.9) < r["reused_over_reusable"] < 1.0, r
        if key[2] == "vllm-0.33.0-lookahead":
            assert r["zero_hits"] == 0 and r["reused_over_reusable"] == 1.0, r
    assert rows[("kimi-k3-dcp8", "replay", "vllm-0.33.0")]["hit_at_1m"] == 10**6 // 128 * 128 - 128


def test_registry_holds_for_the_shipped_rule_set_on_a_slice_of_the_exhaustive_scope():
    """Every scenario invariant on 1/12 of `make verify`'s exhaustive scope (whose rows are for pr53324)."""
    from kvspec.checks.verify.exhaustive import iterate_all
    from kvspec.spec.invariants import compute_violations
    n = 0
    for offset in (0, 5):
        for sc in iterate_all(stride=24, offset=offset, rules="vllm-0.33.0"):
            out = evaluate_scenario(sc)
            assert out.error is None and not compute_violations(sc, out), sc
            n += 1
    assert n > 30_000


def test_vllm_0_34_0_is_the_default_and_hits_14976_on_the_worked_example():
    """vLLM 0.34.0 shipped lookahead hashes where an EAGLE-family drafter needs them (docs: vllm-0.34.md): Kimi-K3,
    P = N = 15000 stores attention {12288, 14976} and Mamba {13824, 14976}, and hits 14976 (0.33.0: 14848)."""
    from kvspec.spec.presets import get_preset
    from kvspec.spec.rules import DEFAULT_RULES, compute_lookahead
    from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
    assert DEFAULT_RULES == "vllm-0.34.0"
    g = get_preset("kimi-k3-dcp8")
    sc = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),))
    out = evaluate_scenario(sc)
    assert sorted(out.present) == [(0, 12288), (0, 14976), (1, 13824), (1, 14976)]
    assert out.hit_length == 14976 and sorted(out.tails) == [(0, 14976), (1, 14976)]
    rs = get_rules("vllm-0.34.0")
    assert compute_lookahead(rs, g) == 1
    no_drafter = attrs.evolve(g, groups=tuple(attrs.evolve(x, eagle=False) for x in g.groups))
    assert compute_lookahead(rs, no_drafter) == 0 and compute_lookahead(get_rules("vllm-0.33.0-lookahead"), no_drafter) == 1


def test_the_drafter_split_has_power():
    """SPLIT (make verify) compares 0.34.0 with its two parents scenario by scenario; a 0.34.0 that applied λ without a
    drafter (kvspec's proposal set) is caught on a non-EAGLE geometry."""
    from kvspec.checks.verify.efficiency import Memo, iterate_split
    from kvspec.spec.geometry import make_geometry
    from kvspec.spec.rules import LOOKAHEAD_ALWAYS, RULE_SETS
    plain = make_geometry(2, [("attention", 4, False), ("mamba", 4, False)], dcp=2)
    eagle = make_geometry(2, [("attention", 4, True), ("mamba", 4, False)], dcp=2)
    assert all(i.holds for g in (plain, eagle) for i in iterate_split(g, "vllm-0.34.0", Memo()))
    wrong = attrs.evolve(RULE_SETS["vllm-0.34.0"], name="vllm-0.34.0-wrong", lookahead_scope=LOOKAHEAD_ALWAYS)
    RULE_SETS[wrong.name] = wrong  # a port that applied λ without a drafter (kvspec's proposal set)
    try:
        assert not all(i.holds for i in iterate_split(plain, wrong.name, Memo()))
        assert all(i.holds for i in iterate_split(eagle, wrong.name, Memo()))  # with a drafter the two agree
    finally:
        del RULE_SETS[wrong.name]


def test_lookahead_save_ends_at_the_last_hashed_scheduler_block():
    """vLLM 0.34.0 (found by its own code): with λ = 1 a 3-token prompt on L = 3 has 2 hashes, so no whole
    scheduler block is hashed and the draft group's 1-token blocks are not saved; at 4 tokens they are (3 hashes)."""
    from kvspec.spec.geometry import make_geometry
    from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
    g = make_geometry(1, [("attention", 3, False), ("mamba", 1, False), ("attention", 1, True)], retention="dense")
    for p, want in ((3, [(1, 1), (1, 2)]), (4, [(0, 3), (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)])):
        sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules="vllm-0.34.0")
        assert sorted(evaluate_scenario(sc).present) == want


def test_closed_forms_read_the_rule_sets_fields_and_refuse_what_they_do_not_state():
    """checks/verify/closed_form.py reads λ and the store rule from the rule set, never its name; a rule set whose λ
    applies only with a drafter (vllm-0.34.0) has no closed form (SPLIT carries its parents' theorems over)."""
    from kvspec.checks.verify.closed_form import read_closed_rules
    assert [read_closed_rules(r) for r in ("pr53324", "vllm-0.33.0", "vllm-0.33.0-lookahead")] == \
        [(False, False), (False, True), (True, True)]
    with pytest.raises(ValueError, match="no closed form"):
        read_closed_rules("vllm-0.34.0")


# a literal equal to a rule set's name that is not one: the scenario JSON's legacy switch, the key grammar's name
NOT_RULE_SETS = {("spec/scenario.py", "legacy"), ("spec/keys.py", "vllm-0.33.0")}


def test_rule_set_names_are_written_only_in_the_table():
    """Code names a rule set through spec/rules.py's constants: a rule set is renamed, or its uses found, in one place
    (issue 27's grep). Docstrings and comments may name them; a string literal equal to a name may not."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    found = []
    for f in sorted(p for d in ("spec", "impl", "checks") for p in (root / d).rglob("*.py")):
        rel = str(f.relative_to(root))
        if rel == "spec/rules.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and node.value in RULE_SETS and (rel, node.value) not in NOT_RULE_SETS:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert found == [], found


def test_a_scenario_holds_its_rule_set_as_a_value():
    """Issue 27: Scenario.rules is the RuleSet itself (a name given is read as its rule set, unknown names refused by
    name); the JSON encoding still names it, and decodes back equal."""
    from kvspec.spec.scenario import decode_scenario, encode_scenario
    g = make_geometry(2, [("attention", 4, False), ("mamba", 8, False)])
    sc = Scenario(geometry=g, prompt=20, stored=(StoredRequest(prompt=20, shared=20, rules="pr53324"),), rules="legacy")
    assert sc.rules is RULE_SETS["legacy"] and sc.stored[0].rules is RULE_SETS["pr53324"]
    assert Scenario(geometry=g, prompt=20).rules is RULE_SETS[DEFAULT_RULES]
    assert encode_scenario(sc)["rules"] == "legacy" and encode_scenario(sc)["requests"][0]["rules"] == "pr53324"
    assert decode_scenario(encode_scenario(sc)) == sc and str(sc.rules) == "legacy"
    with pytest.raises(SpecError) as err:
        Scenario(geometry=g, prompt=20, rules="vllm-9")
    assert err.value.rule == "rules"


def test_legacy_is_the_pr_with_the_other_tail_key_and_so_is_its_mutant():
    """Issue 27: `legacy` is evolve(pr53324, tail_key=hit) (only its name, lineage and notes differ), and the
    legacy-tail-key mutant is the same evolve of whatever rule set it is hunted under: one variant, written once."""
    from kvspec.checks.verify.exhaustive import iterate_all
    from kvspec.checks.verify.mutants import MUTANTS
    legacy, pr = RULE_SETS["legacy"], RULE_SETS["pr53324"]
    same = {"name": pr.name, "predecessor": pr.predecessor, "engine": pr.engine, "deltas": pr.deltas}
    assert attrs.evolve(legacy, **same) == attrs.evolve(pr, tail_key=legacy.tail_key) and legacy.tail_key != pr.tail_key
    mutant = next(m for m in MUTANTS if m.name == "legacy-tail-key")
    assert attrs.evolve(mutant.vary(pr), **same) == attrs.evolve(pr, tail_key=legacy.tail_key)
    n = 0
    for sc in iterate_all(rules="pr53324", stride=13, every=5):  # one geometry in 13, one scenario in 5 of those
        mine, theirs = evaluate_scenario(mutant.vary_scenario(sc)), evaluate_scenario(attrs.evolve(sc, rules=legacy))
        assert (mine.hit_length, mine.tails, mine.load, mine.error) == \
               (theirs.hit_length, theirs.tails, theirs.load, theirs.error), sc
        n += 1
    assert n > 10_000


def test_a_mutants_rule_set_is_answered_explicitly_only():
    """A rule set whose steps a mutant replaced is the spec's no more: answered explicitly with its own steps (the
    inverted tail condition stores less than the PR's rule on the two-Mamba preset), and refused by the compact form
    (runs and points) rather than answered with the spec's own steps."""
    from kvspec.checks.verify.mutants import MUTANTS
    from kvspec.spec.presets import get_preset
    from kvspec.spec.scenario import compute_stored
    sc = Scenario(geometry=get_preset("tiny-two-mamba"), prompt=18, stored=(StoredRequest(prompt=18, shared=18),),
                  rules="pr53324")
    m = next(x for x in MUTANTS if x.name == "store-tail-any-mamba")
    assert set(compute_stored(m.vary_scenario(sc), compact=False)) < set(compute_stored(sc, compact=False))
    with pytest.raises(SpecError) as err:
        compute_stored(m.vary_scenario(sc), compact=True)
    assert err.value.rule == "limit-shards"
