"""SGLang 0.5.23's HiCache L3 on Mooncake as a rule set (issue 32), stated from its sources: whole-page hits, one
Mamba state per request on its grid, bigram keys for EAGLE without Mamba, its DCP refusals; the draft-KV hazard of
Mamba hybrids with EAGLE (plain page keys, no drop) and the bigram fix."""

from __future__ import annotations

import pytest

from kvspec.spec.content import compute_wrong_positions
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.rules import compute_lookahead, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario
from kvspec.spec.store import compute_rule_store

SG, FIX = "sglang-0.5.23", "sglang-0.5.23-bigram"


def kimi_like(d: int = 8, page: int = 1024, grid: int = 4096, eagle: bool = False) -> Geometry:
    """Return Kimi-like MLA + KDA under SGLang's DCP: a page of `page` tokens (per-rank block page/D), KDA states on a
    grid of `grid` tokens; kvspec's unit is the per-rank block (it divides it)."""
    return Geometry(unit=page // d, groups=(Group(kind="attention", block_size=page // d, eagle=eagle),
                                            Group(kind="mamba", block_size=grid)),
                    parallel=Parallel(dcp=d), retention="replay")


def test_kimi_like_mla_kda_dcp():
    """Whole pages and one KDA state at the stored request's last grid point; a hit only where both exist, on every
    rank; every load key is a stored key (the hit is itself a stored boundary of every group)."""
    g = kimi_like()
    assert compute_rule_store(get_rules(SG), g, 30000) == frozenset(
        {(0, k * 1024) for k in range(1, 30)} | {(1, 28672)})
    resend = evaluate_scenario(Scenario(geometry=g, prompt=30000, stored=(StoredRequest(prompt=30000, shared=30000),),
                                        rules=SG))
    assert resend.hit_length == 28672 and dict(resend.tails) == {0: 28672, 1: 28672}
    assert {e.key_boundary for e in resend.load} <= {t for _, t in resend.present}
    shared = Scenario(geometry=g, prompt=40000, stored=(StoredRequest(prompt=30000, shared=20000),), rules=SG)
    assert evaluate_scenario(shared).hit_length == 0  # the one state (28672) lies past the shared prefix
    two = Scenario(geometry=g, prompt=40000, stored=(StoredRequest(prompt=20480, shared=20480),
                                                     StoredRequest(prompt=30000, shared=25000)), rules=SG)
    assert evaluate_scenario(two).hit_length == 20480  # the first request's state, its pages, the second's not needed
    evicted = Scenario(geometry=g, prompt=30000, stored=(StoredRequest(prompt=30000, shared=30000),),
                       evicted=frozenset({(0, 5120, 7)}), rules=SG)
    assert evaluate_scenario(evicted).hit_length == 0  # one rank lost a page below the only state


@pytest.mark.parametrize("geometry, rule", [
    (kimi_like(eagle=True), "sglang-dcp"),  # DCP allows DSPARK only
    (Geometry(unit=128, groups=(Group(kind="attention", block_size=128), Group(kind="attention", block_size=128),
                                Group(kind="mamba", block_size=1024)), parallel=Parallel(dcp=8)), "sglang-dcp"),
    (Geometry(unit=64, groups=(Group(kind="attention", block_size=128), Group(kind="mamba", block_size=1536)),
              parallel=Parallel(dcp=8)), "sglang-mamba-grid"),
    (Geometry(unit=64, groups=(Group(kind="attention", block_size=128), Group(kind="attention", block_size=64),
                               Group(kind="mamba", block_size=1024))), "sglang-page"),
    (Geometry(unit=128, groups=(Group(kind="attention", block_size=128), Group(kind="mamba", block_size=1024)),
              parallel=Parallel(dcp=8), retention="dense"), "sglang-retention"),
    (Geometry(unit=64, groups=(Group(kind="attention", block_size=128),), parallel=Parallel(dcp=8, interleave=2)),
     "sglang-dcp"),
])
def test_what_sglang_refuses(geometry, rule):
    with pytest.raises(SpecError) as exc:
        Scenario(geometry=geometry, prompt=100, stored=(StoredRequest(prompt=100, shared=100),), rules=SG)
    assert exc.value.rule == rule


def test_bigram_keys_without_mamba_only():
    """EAGLE without a Mamba group: bigram keys (λ = 1; a prompt ending on a page stores one page less, no drop);
    with a Mamba group SGLang switches them off (λ = 0) and still takes no drop."""
    att = Geometry(unit=16, groups=(Group(kind="attention", block_size=16, eagle=True),))
    hyb = Geometry(unit=16, groups=(Group(kind="attention", block_size=16, eagle=True),
                                    Group(kind="mamba", block_size=16)))
    assert compute_lookahead(get_rules(SG), att) == 1 and compute_lookahead(get_rules(SG), hyb) == 0
    assert compute_lookahead(get_rules(FIX), hyb) == 1
    assert max(t for _, t in compute_rule_store(get_rules(SG), att, 64)) == 48
    resend = Scenario(geometry=hyb, prompt=70, stored=(StoredRequest(prompt=70, shared=70),), rules=SG)
    assert evaluate_scenario(resend).hit_length == 64  # the state at the last grid point; no EAGLE drop
    # a prompt ending on the grid keeps its one state at P, past a resend's bound ⌊(N − 1)/page⌋ (kvspec's reading of
    # prepare_for_caching_req for a prompt alone; open: the inserted length of a finished request, spec/README.md)
    on_grid = Scenario(geometry=hyb, prompt=64, stored=(StoredRequest(prompt=64, shared=64),), rules=SG)
    assert evaluate_scenario(on_grid).hit_length == 0


def test_draft_kv_hazard_in_sglang_and_the_bigram_fix():
    """A Mamba hybrid with EAGLE: a 1-token request stored, a 2-token one sharing it looks up: SGLang loads the page
    whose draft row read the writer's next token (plain keys, no drop) — kvspec's content check names it; kvspec's
    pinned example (97 then 120 stored) adds the first writer's row at 96. Bigram keys (λ = 1) load neither."""
    g = Geometry(unit=1, groups=(Group(kind="attention", block_size=1, eagle=True), Group(kind="mamba", block_size=1)))
    small = Scenario(geometry=g, prompt=2, stored=(StoredRequest(prompt=1, shared=1),), rules=SG)
    assert compute_wrong_positions(small, evaluate_scenario(small)) == ((0, 0),)
    pinned = Scenario(geometry=g, prompt=130, stored=(StoredRequest(prompt=97, shared=97),
                                                      StoredRequest(prompt=120, shared=120)), rules=SG)
    out = evaluate_scenario(pinned)
    assert out.hit_length == 120 and compute_wrong_positions(pinned, out) == ((0, 96), (0, 119))
    for sc in (small, pinned):
        fixed = Scenario(geometry=g, prompt=sc.prompt, stored=sc.stored, rules=FIX)
        assert compute_wrong_positions(fixed, evaluate_scenario(fixed)) == ()


def test_the_implementation_has_no_sglang_store_rule():
    """impl/ stores under pr53324's and vLLM's rules only: asking it for SGLang's is a clear refusal, not vLLM's rule."""
    from kvspec.checks.adapters import compute_impl_store_rule
    with pytest.raises(SpecError) as exc:
        compute_impl_store_rule(SG)
    assert exc.value.rule == "impl-rules"
