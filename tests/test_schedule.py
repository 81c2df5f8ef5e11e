"""The chunk schedule (spec/schedule.py): which Mamba states a prefill leaves, and what the store rule can store.

The pinned figures are vLLM 0.33.0's real Scheduler + KVCacheManager + Mooncake store connector, stepped on the
Kimi-like geometry (DCP 8, attention 1536 with EAGLE, Mamba 1536, u = 128), as measured in issue 29.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.spec.errors import SpecError
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import get_rules
from kvspec.spec.scenario import (
    Scenario,
    StoredRequest,
    compute_hit,
    decode_scenario,
    encode_scenario,
    evaluate_scenario,
)
from kvspec.spec.schedule import (
    BLOCK_SCHEDULE,
    Schedule,
    compute_checkpoints,
    compute_scheduler_block,
)
from kvspec.spec.store import compute_rule_store

from .support.cli import run_cli
from .support.strategies import geometries, scenarios

KIMI = get_preset("kimi-k3-dcp8")
V33 = get_rules("vllm-0.33.0")


def mamba(objs, g=KIMI):
    return sorted(t for gi, t in objs if g.groups[gi].kind == "mamba")


def attention(objs, g=KIMI):
    return sorted(t for gi, t in objs if g.groups[gi].kind == "attention")


@pytest.mark.parametrize(("prompt", "budget", "retention", "align", "ends", "states", "att"), [
    # 9 x 1536, 1024 (stopping at the checkpoint 14848), 152; the worked example's store
    (15000, 2048, "replay", None, [1536 * k for k in range(1, 10)] + [14848, 15000], [14848], [12288, 14976]),
    # one long chunk to the last cacheable block end, then the checkpoint: no state at the replay point 12288
    (30000, 32768, "replay", None, [27648, 29824, 30000], [29824], [12288, 24576, 29952]),
    (30000, 2048, "replay", None, None, [12288, 29824], [12288, 24576, 29952]),
    (26000, 32768, "dense", None, [23040, 25856, 26000], [23040, 25856], [12288, 24576, 25984]),
    (15000, 2048, "dense", None, None, [1536 * k for k in range(1, 10)] + [14848], [12288, 14976]),
    (15000, 16384, "dense", None, [12288, 14848, 15000], [12288, 14848], [12288, 14976]),
    (15000, 16384, "dense", 16, [15000], [14848], [12288, 14976]),  # a prefill checkpoint block exports 14848
])
def test_vllm_scheduler_measurements(prompt, budget, retention, align, ends, states, att):
    g = attrs.evolve(KIMI, retention=retention)
    s = Schedule(budget=budget, checkpoint_alignment=align)
    if ends is not None:
        assert list(compute_checkpoints(s, g, prompt, 0).ends) == ends
    stored = compute_rule_store(V33, g, prompt, s)
    assert mamba(stored) == states and attention(stored) == att


def test_shared_prefix_under_a_large_budget_misses():
    """P = 26000 stored under 32768 with dense retention, a request sharing 20000: vLLM hits 0 (issue 29), the
    block schedule 10752."""
    g = attrs.evolve(KIMI, retention="dense")
    sc = Scenario(geometry=g, prompt=30000, stored=(StoredRequest(prompt=26000, shared=20000),), rules="vllm-0.33.0")
    assert compute_hit(sc) == 10752
    assert compute_hit(attrs.evolve(sc, schedule=Schedule(budget=32768))) == 0


def test_eagle_drop_hides_replay_states_from_shared_prefixes():
    """Under 0.33.0 with EAGLE a replay-point state never serves a shared prefix: P = 30000 at budget 2048 stores Mamba
    12288, and a request sharing 20000 hits 0 (vLLM too)."""
    sc = Scenario(geometry=KIMI, prompt=30000, stored=(StoredRequest(prompt=30000, shared=20000),),
                  rules="vllm-0.33.0", schedule=Schedule(budget=2048))
    assert 12288 in mamba(compute_rule_store(V33, KIMI, 30000, sc.schedule))
    assert compute_hit(sc) == 0


@settings(max_examples=300)
@given(g=geometries(max_unit=8, max_q=6), k=st.integers(1, 40), rules=st.sampled_from(
    ["vllm-0.33.0", "vllm-0.33.0-lookahead", "vllm-0.34.0"]))
def test_budget_of_one_block_is_the_block_schedule(g, k, rules):
    """A budget of b_s (every chunk one Mamba block) leaves the states the block schedule assumes: two derivations of
    the same store agree."""
    b = compute_scheduler_block(g)
    rs = get_rules(rules)
    p = k * g.unit + (k % 3)
    if b == 0:
        return
    assert compute_rule_store(rs, g, p, Schedule(budget=b)) == compute_rule_store(rs, g, p, BLOCK_SCHEDULE)


@settings(max_examples=300)
@given(sc=scenarios(rules="vllm-0.33.0"))
def test_a_schedule_only_removes_states(sc):
    """The block schedule is the finest: any schedule stores a subset of its objects (attention never changes), so
    the hit never exceeds the block schedule's (MONO-EVICT), and every planned load key is present."""
    block = attrs.evolve(sc, schedule=BLOCK_SCHEDULE)
    rs = sc.rules
    for r in sc.stored:
        got, full = (compute_rule_store(rs, sc.geometry, r.prompt, s) for s in (sc.schedule, BLOCK_SCHEDULE))
        assert got <= full and attention(got, sc.geometry) == attention(full, sc.geometry)
    out = evaluate_scenario(sc)
    assert out.hit_length <= compute_hit(block)
    assert out.error is None and all(e.present for e in out.load)


def test_schedule_round_trips_and_refusals():
    sc = Scenario(geometry=KIMI, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),),
                  rules="vllm-0.33.0", schedule=Schedule(budget=8192, checkpoint_alignment=16))
    raw = encode_scenario(sc)
    assert raw["schedule"] == {"budget": 8192, "checkpoint_alignment": 16}
    assert decode_scenario(raw) == sc
    assert "schedule" not in encode_scenario(attrs.evolve(sc, schedule=BLOCK_SCHEDULE))
    with pytest.raises(SpecError, match="^schedule: rule set pr53324"):
        attrs.evolve(sc, rules="pr53324")
    with pytest.raises(SpecError, match="^schedule-unschedulable: with chunked prefill off"):
        attrs.evolve(sc, schedule=Schedule(budget=8192, chunked=False))
    with pytest.raises(SpecError, match="^schedule: unknown schedule keys: bugdet"):
        decode_scenario({**raw, "schedule": {"bugdet": 1}})
    with pytest.raises(SpecError, match="^schedule: chunk budget must be an integer >= 1"):
        Schedule(budget=0)


EXPLAIN = ["explain", "--rules", "vllm-0.33.0", "--preset", "kimi-k3-dcp8", "--stored-prompt", "30000",
           "--prompt", "30000"]


def test_explain_shows_the_chunk_ends_and_the_states(capsys):
    rc, out, _ = run_cli([*EXPLAIN, "--chunk-budget", "32768"], capsys)
    assert rc == 0
    assert "  1      mamba      1536   1536   no     [29824]" in out
    assert "chunks end at [27648, 29824, 30000]; Mamba states exist at: group 1 [27648, 29824]" in out
    rc, out, _ = run_cli([*EXPLAIN, "--chunk-budget", "2048"], capsys)
    assert rc == 0 and "  1      mamba      1536   1536   no     [12288, 29824]" in out


def test_explain_block_schedule_names_the_release_default(capsys):
    rc, out, _ = run_cli(["explain", "--rules", "vllm-0.33.0", "--preset", "kimi-k3-dcp8", "--retention", "dense",
                          "--stored-prompt", "26000", "--prompt", "30000", "--shared", "20000"], capsys)
    assert rc == 0 and "schedule: block" in out
    assert "under vLLM serve's default budget (--chunk-budget 8192, H100/H200) the hit is 7680, not 10752" in out


@pytest.mark.parametrize(("extra", "rule"), [
    (["--chunk-budget", "8192", "--rules", "pr53324"], "schedule"),
    (["--checkpoint-alignment", "16"], "schedule"),
    (["--chunk-budget", "8192", "--no-chunked-prefill"], "schedule-unschedulable"),
    (["--chunk-budget", "0"], "schedule"),
])
def test_explain_refuses_bad_schedules(capsys, extra, rule):
    argv = [a for a in EXPLAIN if a not in ("--rules", "vllm-0.33.0")] if "--rules" in extra else EXPLAIN
    rc, _, err = run_cli([*argv, *extra], capsys)
    assert rc == 2 and f"{rule}:" in err and "Traceback" not in err


def test_shared_system_prompt_table():
    """The README's shared-system-prompt table (kvspec bench): large budgets lose hits the block schedule has, and
    kvspec's proposal (a chunk also ending at every k·L and k·L − b) gets every one back."""
    from kvspec.checks.bench.runner import bench_shared_prompt
    rows = bench_shared_prompt()
    assert len(rows) == 12
    assert all(r["hits"]["32768+L"] == r["hits"]["block"] for r in rows)
    assert all(r["steps"]["32768+L"] >= r["steps"]["32768"] for r in rows)
    lost = [r for r in rows if r["hits"]["32768"] < r["hits"]["block"]]
    assert {(r["retention"], r["rules"], r["system_prompt"]) for r in lost} == {
        ("replay", "vllm-0.33.0", 65536), ("dense", "vllm-0.33.0", 20000), ("dense", "vllm-0.33.0", 65536),
        ("dense", "vllm-0.34.0", 20000), ("dense", "vllm-0.34.0", 65536)}


def test_stop_every_is_a_proposal_option(capsys):
    rc, out, _ = run_cli(["explain", "--preset", "kimi-k3-dcp8", "--retention", "dense", "--stored-prompt", "66536",
                          "--shared", "65536", "--prompt", "66536", "--chunk-budget", "32768", "--stop-every", "12288"],
                         capsys)
    assert rc == 0 and "hit length: 61440" in out and "kvspec's proposal" in out


def test_a_trace_is_a_schedule():
    """Observed chunks (ends, starts) and the junction vLLM pinned: the spec derives the states from them; replay
    retention keeps the junction's state (aligned down to a, then b) when a chunk ended there."""
    g = attrs.evolve(KIMI, retention="replay", groups=(attrs.evolve(KIMI.groups[0], eagle=False), KIMI.groups[1]))
    trace = Schedule(ends=(6144, 12288, 15360, 20000), starts=(0, 6144, 12288, 15360))
    pinned = attrs.evolve(trace, junctions=(0, 0, 15400, 15400))
    assert 15360 not in mamba(compute_rule_store(V33, g, 20000, trace), g)
    assert 15360 in mamba(compute_rule_store(V33, g, 20000, pinned), g)
    sc = Scenario(geometry=g, prompt=20000, rules="vllm-0.33.0",
                  stored=(StoredRequest(prompt=20000, shared=16000, schedule=pinned),))
    raw = encode_scenario(sc)
    assert raw["requests"][0]["schedule"] == {"ends": [6144, 12288, 15360, 20000], "starts": [0, 6144, 12288, 15360],
                                              "junctions": [0, 0, 15400, 15400]}
    assert decode_scenario(raw) == sc


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"junctions": (5,)}, "a junction is observed per chunk"),
    ({"ends": (10, 20), "starts": (0,)}, "chunk starts: one integer per end"),
    ({"ends": (10,), "budget": 8}, "observed chunk ends replace the derivation"),
    ({"ends": (10,), "checkpoint_alignment": 16}, "need their starts"),
])
def test_trace_refusals(kwargs, message):
    with pytest.raises(SpecError, match=message):
        Schedule(**kwargs)


def test_trace_past_the_prompt_is_refused():
    with pytest.raises(SpecError, match="past the stored prompt"):
        Scenario(geometry=KIMI, prompt=100, rules="vllm-0.33.0",
                 stored=(StoredRequest(prompt=100, shared=100, schedule=Schedule(ends=(200,))),))
