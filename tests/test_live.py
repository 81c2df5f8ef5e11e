"""Live differential tests: real mooncake_master, real DCP rank processes, impl vs spec."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario

from .conftest import require
from .support.live import run

pytestmark = pytest.mark.live
cluster = require("kvspec.impl.cluster")


def scaled(dcp: int, eagle: bool = True, retention: str = "replay", draft: bool = False) -> Geometry:
    groups = [Group(kind="attention", block_size=16, eagle=eagle)]
    if draft:
        groups.append(Group(kind="attention", block_size=16))
    groups.append(Group(kind="mamba", block_size=16))
    return Geometry(unit=4, groups=tuple(groups), parallel=Parallel(dcp=dcp), retention=retention)


def test_worked_example_scaled_dcp2(master, tmp_path):
    """The #53324 shape scaled down (u=4, b=16, D=2): fixed rule loads, legacy gets -704 from the real store."""
    g = scaled(2)
    fixed = Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="pr53324")
    shipped = Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="vllm-0.33.0")
    legacy = Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="legacy")
    assert (evaluate_scenario(fixed).hit_length, evaluate_scenario(shipped).hit_length) == (48, 52)
    totals = run(master, [fixed, shipped, legacy], tmp_path, "example-d2")
    assert totals["bytes_compared"] > 0 and totals["bytes_wrong"] == 0
    assert totals["minus704"] == 2  # the legacy attention tail block, on each of the 2 ranks


def test_worked_example_through_host_staging(master, tmp_path):
    """The path a non-CUDA store client takes with CUDA tensors (KV copied through host mirrors before a put
    and after a get), forced here on CPU tensors: the same bytes load, nothing wrong."""
    g = scaled(2)
    scs = [Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules=r)
           for r in ("pr53324", "vllm-0.33.0")]
    totals = run(master, scs, tmp_path, "staging-d2", env={"KVSPEC_STAGING": "1"})
    assert totals["bytes_compared"] > 0 and totals["bytes_wrong"] == 0 and totals["minus704"] == 0
    assert totals["staged_ranks"] == 2



@pytest.mark.parametrize("rules", ["pr53324", "vllm-0.33.0"])
@pytest.mark.parametrize("dcp,retention,draft", [(2, "replay", False), (4, "dense", True)])
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_differential_hypothesis(master, tmp_path_factory, dcp, retention, draft, rules, data):
    """Hypothesis-generated scenarios (prompts, shared prefixes, several stored requests, EAGLE on/off)."""
    eagle = data.draw(st.booleans(), label="eagle")
    g = scaled(dcp, eagle=eagle, retention=retention, draft=draft)
    # one scenario that always hits (an identical resend), then drawn ones
    scs = [Scenario(geometry=g, prompt=57 + 8 * dcp, stored=(StoredRequest(prompt=57 + 8 * dcp, shared=57 + 8 * dcp),),
                    rules=rules)]
    for _ in range(7):
        n = data.draw(st.one_of(st.integers(1, 150), st.integers(30, 150)), label="prompt")
        stored = []
        for _ in range(data.draw(st.integers(1, 2), label="stored requests")):
            p = data.draw(st.one_of(st.just(n), st.integers(n, n + 40), st.integers(0, 150)), label="stored prompt")
            s = data.draw(st.one_of(st.just(min(p, n)), st.integers(0, min(p, n))), label="shared")
            stored.append(StoredRequest(prompt=p, shared=s))
        scs.append(Scenario(geometry=g, prompt=n, stored=tuple(stored), rules=rules))
    totals = run(master, scs, tmp_path_factory.mktemp("drt"), f"drt-d{dcp}-{rules}")
    assert totals["bytes_compared"] > 0 and totals["bytes_wrong"] == 0


@pytest.mark.slow
def test_worked_example_kimi_dcp8(master, tmp_path):
    """The full kimi-k3-dcp8 geometry on 8 rank processes; legacy tail load is -704 on every rank."""
    g = get_preset("kimi-k3-dcp8")
    fixed = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),), rules="pr53324")
    shipped = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),),
                       rules="vllm-0.33.0")
    legacy = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),), rules="legacy")
    totals = run(master, [fixed, shipped, legacy], tmp_path, "kimi-d8")
    assert totals["bytes_wrong"] == 0 and totals["minus704"] == 8


def mixed(dcp: int, retention: str) -> Geometry:
    """Two attention spans (b = 16 with EAGLE, b = 8) and two Mamba block sizes (16, 24): the store rules and the
    lookup must treat each group by its own span."""
    return Geometry(unit=4, groups=(Group(kind="attention", block_size=16, eagle=True),
                                    Group(kind="attention", block_size=8), Group(kind="mamba", block_size=16),
                                    Group(kind="mamba", block_size=24)), parallel=Parallel(dcp=dcp), retention=retention)


@pytest.mark.parametrize("retention", ["replay", "dense"])
def test_differential_two_attention_spans_two_mamba_sizes(master, tmp_path, retention):
    """Both rule sets on the mixed geometry: resends around every span multiple, shared prefixes, two stored requests
    sharing a prefix (the second store must skip the keys the first wrote: no redundant put)."""
    g = mixed(2, retention)
    scs = []
    for rules in ("pr53324", "vllm-0.33.0"):
        for p in (49, 96, 97, 145, 192, 193):
            scs.append(Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules=rules))
        scs.append(Scenario(geometry=g, prompt=150, stored=(StoredRequest(prompt=120, shared=100),
                                                            StoredRequest(prompt=170, shared=150)), rules=rules))
    assert sum(evaluate_scenario(sc).hit_length > 0 for sc in scs) >= 10
    totals = run(master, scs, tmp_path, f"mixed-{retention}")
    assert totals["bytes_compared"] > 0 and totals["bytes_wrong"] == 0


def test_redundant_puts_are_counted(master, tmp_path):
    """A store path that re-puts keys that exist (FaultPlan.reput skips the existence check) loads the right
    bytes (write-once keeps the first value) but the harness counts the redundant puts and fails."""
    g = scaled(2)
    sc = Scenario(geometry=g, prompt=90, stored=(StoredRequest(prompt=90, shared=90), StoredRequest(prompt=100, shared=90)),
                  rules="vllm-0.33.0")
    with pytest.raises(AssertionError, match="redundant puts"):
        run(master, [sc], tmp_path, "reput", faults={"reput": True})
    assert run(master, [sc], tmp_path, "no-reput")["bytes_wrong"] == 0


@pytest.mark.parametrize("rules,lookahead_bytes", [("vllm-0.33.0", True), ("vllm-0.33.0-lookahead", False)])
def test_draft_hazard_closed_by_lookahead_keys(master, tmp_path, rules, lookahead_bytes):
    """The draft-KV hazard on real ranks and a real store (tests/test_draft_lookahead.py's case at D = 2, where the
    attention block is 2 tokens, so the shorter writer ends on a block end: 98): a 98-token request stored before a
    120-token one sharing it. Legacy hashes: the reader loads draft KV at position 97 that saw the writer's sampled
    token (draft_lookahead_bytes > 0, and the spec's content model names it). Lookahead
    keys (each hash covers the next token, no EAGLE drop): every byte is the reader's own, draft bytes included."""
    from kvspec.spec.content import compute_wrong_positions
    g = Geometry(unit=1, groups=(Group(kind="attention", block_size=1, eagle=True), Group(kind="mamba", block_size=1)),
                 parallel=Parallel(dcp=2), retention="replay")
    sc = Scenario(geometry=g, prompt=120, stored=(StoredRequest(prompt=98, shared=98),
                                                  StoredRequest(prompt=120, shared=120)), rules=rules)
    assert bool(compute_wrong_positions(sc, evaluate_scenario(sc))) is lookahead_bytes
    totals = run(master, [sc], tmp_path, f"draft-{rules}")
    assert totals["bytes_wrong"] == 0 and totals["bytes_compared"] > 0
    assert (totals["draft_lookahead_bytes"] > 0) is lookahead_bytes, totals


def test_deferred_saves_on_real_ranks(master, tmp_path):
    """A writer of 64 prompt tokens that decoded 2 and a reader continuing its conversation through the first output
    (vLLM 0.34.0, dense retention, D = 2): the writer's ranks also put the block and the Mamba state at 64 whose
    hashes needed that output (every put key predicted by the spec), and the reader hits 64 where a writer that had
    not decoded leaves 60 — 0 wrong bytes, no -704."""
    g = scaled(2, retention="dense")
    scs = [Scenario(geometry=g, prompt=80, rules="vllm-0.34.0", stored=(StoredRequest(prompt=64, shared=s, decoded=o),))
           for s, o in ((65, 2), (64, 0))]
    assert [evaluate_scenario(sc).hit_length for sc in scs] == [64, 60]
    totals = run(master, scs, tmp_path, "deferred")
    assert totals["bytes_wrong"] == 0 and totals["minus704"] == 0 and totals["bytes_compared"] > 0


def test_save_decode_cache_on_real_ranks(master, tmp_path):
    """save_decode_cache (vLLM 0.34.0, replay retention, D = 2): a writer of 64 prompt tokens decodes 40 and also
    stores the decode phase — its whole blocks and, one per L = 32, its Mamba states (96) — so a reader continuing
    through 36 outputs hits 96 (without the option: 60); 0 wrong bytes, no -704, every put key predicted."""
    g = scaled(2)
    scs = [Scenario(geometry=g, prompt=110, rules="vllm-0.34.0",
                    stored=(StoredRequest(prompt=64, shared=100, decoded=40, save_decode_cache=sdc),)) for sdc in (True, False)]
    assert [evaluate_scenario(sc).hit_length for sc in scs] == [96, 60]
    totals = run(master, scs, tmp_path, "decode-cache")
    assert totals["bytes_wrong"] == 0 and totals["minus704"] == 0 and totals["bytes_compared"] > 0


def test_mixed_fleet_on_real_ranks(master, tmp_path):
    """A fleet mixing vLLM 0.33.0 and 0.34.0 engines on one store (writers and reader on real rank processes, the
    writers keyed as their own release keys): with an EAGLE drafter the two hash with different λ and name no common
    key — a 0.34.0 reader after a 0.33.0 writer hits 0 (the same fleet: 56), nothing wrong loaded; beside a 0.34.0
    writer of the same prompt it hits 56 from that one; without a drafter both hash alike and share everything."""
    eagle, plain = scaled(2), scaled(2, eagle=False)
    mixed = [Scenario(geometry=eagle, prompt=57, stored=(StoredRequest(prompt=57, shared=57, rules="vllm-0.33.0"),),
                      rules="vllm-0.34.0"),
             Scenario(geometry=eagle, prompt=57, stored=(StoredRequest(prompt=57, shared=57, rules="vllm-0.33.0"),
                                                         StoredRequest(prompt=57, shared=57)), rules="vllm-0.34.0")]
    assert [evaluate_scenario(sc).hit_length for sc in mixed] == [0, 56]
    totals = run(master, mixed, tmp_path, "mixed-eagle")
    assert totals["bytes_wrong"] == 0 and totals["minus704"] == 0 and totals["bytes_compared"] > 0
    shared = Scenario(geometry=plain, prompt=57, stored=(StoredRequest(prompt=57, shared=57, rules="vllm-0.33.0"),),
                      rules="vllm-0.34.0")
    assert evaluate_scenario(shared).hit_length == 56
    totals = run(master, [shared], tmp_path, "mixed-plain")
    assert totals["bytes_wrong"] == 0 and totals["bytes_compared"] > 0
