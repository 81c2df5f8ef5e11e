"""Cache efficiency per rule set: the physical best, the resend closed form, monotonicity, and the bench tables.

The `make verify` rows (BEST/…, RESEND/…, MONO-…/…) sweep the scope; these pin the findings on their
smallest examples, check the closed form at scale, and run `kvspec bench --efficiency-only --plot`.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.checks.cli.main import main
from kvspec.spec.geometry import make_geometry
from kvspec.spec.lookup import compute_physical_best, compute_resend_best
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, compute_stored, evaluate_scenario
from kvspec.spec.store import compute_present_after


def hit(g, n, stored, evicted=frozenset(), rules="pr53324"):
    return evaluate_scenario(Scenario(geometry=g, prompt=n, stored=stored, evicted=evicted, rules=rules)).hit_length


def test_evicting_a_mamba_state_raises_the_pr53324_hit():
    """PR #53324's rules: with the Mamba tail state at P = N stored, the hit is re-derived at N − 1 and the attention
    scan, capped there, misses the tail key at N: h = 0. Evict that state and h = 3 (MONO-EVICT/pr53324)."""
    g = make_geometry(1, [("attention", 2, False), ("mamba", 3, False)])
    stored = (StoredRequest(prompt=4, shared=4),)
    assert hit(g, 4, stored) == 0
    assert hit(g, 4, stored, frozenset({(1, 4, 0)})) == 3


def test_storing_one_more_request_lowers_the_pr53324_hit():
    g = make_geometry(1, [("attention", 3, False), ("mamba", 2, False)])
    one = (StoredRequest(prompt=6, shared=6),)
    assert hit(g, 6, one) == 4
    assert hit(g, 6, one + (StoredRequest(prompt=7, shared=6),)) == 0  # MONO-MORE/pr53324


def test_vllm_leaves_a_loadable_hit_after_the_rederivation():
    """vLLM 0.33.0's rules too (BEST/vllm-0.33.0): attention key 5 lost, h = 5 is loadable from the block key 6 (= N),
    but the re-derivation at N − 1 caps the attention scan below it; h = 0 (vLLM's own code agrees:
    tests/test_vllm_conformance.py)."""
    g = make_geometry(1, [("attention", 2, False), ("mamba", 2, False), ("mamba", 3, False)], retention="dense")
    sc = Scenario(geometry=g, prompt=6, stored=(StoredRequest(prompt=6, shared=6),), evicted=frozenset({(0, 5, 0)}),
                  rules="vllm-0.33.0")
    e = compute_present_after(g, compute_stored(sc), sc.evicted)
    assert evaluate_scenario(sc).hit_length == 0 and compute_physical_best(g, e, 6) == 5


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10**6), st.sampled_from(["replay", "dense"]), st.booleans())
def test_vllm_resend_closed_form_at_scale(p, retention, eagle):
    """RESEND/vllm-0.33.0 at Kimi-K3 scale: an identical resend hits ⌊(P−1)/a⌋·a, with EAGLE max(⌊P/a⌋·a − a, 0)."""
    import attrs
    g = get_preset("kimi-k3-dcp8")
    g = attrs.evolve(g, retention=retention, groups=(attrs.evolve(g.groups[0], eagle=eagle), g.groups[1]))
    sc = Scenario(geometry=g, prompt=p, stored=(StoredRequest(prompt=p, shared=p),), rules="vllm-0.33.0")
    assert evaluate_scenario(sc).hit_length == compute_resend_best(g, p)


def test_efficiency_rows_can_fail():
    """A property row expected to hold fails when it is refuted, and one expected refuted fails when it holds."""
    from kvspec.checks.verify.manifest import PropertyCheck
    wrong = PropertyCheck(prop="MONO-EVICT", rows=(("pr53324", "holds", None),), sample=7)
    (row,) = wrong.render([wrong.run(k, True) for k in wrong.parts(True)])
    assert not row.ok and row.detail["command"].startswith("kvspec explain")
    wrong = PropertyCheck(prop="RESEND", rows=(("vllm-0.33.0", "refuted", None),), sample=3)  # not in --fast: run it whole
    assert not wrong.render([wrong.run(k, False) for k in wrong.parts(False)])[0].ok


def test_bench_efficiency_tables_and_plot(tmp_path, capsys):
    png = tmp_path / "hit.png"
    assert main(["bench", "--efficiency-only", "--quick", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["geometry"], r["retention"], r["rules"]): r for r in out["efficiency"]}
    assert rows[("kimi-k3-dcp8", "replay", "vllm-0.33.0-lookahead")]["reused_over_reusable"] == 1.0
    assert 0.98 < rows[("kimi-k3-dcp8", "replay", "vllm-0.33.0")]["reused_over_reusable"] < 1.0  # the EAGLE drop
    assert rows[("kimi-k3-dcp8", "replay", "pr53324")]["zero_hits"] > 0  # the #56615 gaps
    assert rows[("kimi-k3-dcp8", "replay", "pr53324")]["hit_at_1m"] == 0
    conv = {(r["geometry"], r["retention"], r["rules"]): r for r in out["conversations"]}
    assert conv[("small-dcp2", "replay", "vllm-0.33.0")]["reused_over_reusable"] < 1.0  # the EAGLE drop's unit
    assert conv[("small-dcp2", "replay", "vllm-0.33.0")]["zero_hits"] == 0
    assert conv[("small-dcp2", "replay", "pr53324")]["zero_hits"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    # issue 30: the run's own wall and CPU time beside the calibration measured in it
    assert out["wall_seconds"] > 0 and out["cpu_seconds"] > 0 and out["calibration"]["loop_seconds"] > 0
    svg = tmp_path / "hit.svg"
    assert main(["bench", "--efficiency-only", "--quick", "--plot", str(svg)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("kvspec bench: wall ") and "CPU" in last and "calibration loop" in last and "loop units" in last
    text = svg.read_text()
    assert "pr53324" in text and "vllm-0.33.0" in text and "identical resend" in text and "shared system prompt" in text
    assert out["shared_prompt"] and len(out["shared_prompt"]) == 12
    import pytest
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--efficiency-only", "--quick", "--plot", str(tmp_path / "no" / "dir" / "x.png")])
    assert exc.value.code == 2 and "output-file" in capsys.readouterr().err


def test_a_store_rule_that_stores_less_is_caught_by_the_efficiency_rows():
    """Issue 30: were the spec's store rule one that stores less, safely, the registry would judge it against its own
    smaller E and pass it (every hit is still the best that E allows); the efficiency rows judge the store rule: the
    PR's tail condition inverted (drop T when it is a multiple of *any* Mamba block size) loses resends the PR's rule
    hits — the two-Mamba preset: 12 → 0 — and moves the pinned refutation count of RESEND/pr53324."""
    from kvspec.checks.verify.efficiency import Memo, iterate_resend
    from kvspec.checks.verify.mutants import MUTANTS
    m = next(x for x in MUTANTS if x.name == "store-tail-any-mamba")
    g = get_preset("tiny-two-mamba")
    sc = Scenario(geometry=g, prompt=18, stored=(StoredRequest(prompt=18, shared=18),), rules="pr53324")
    assert evaluate_scenario(sc).hit_length == 12 and evaluate_scenario(m.vary_scenario(sc)).hit_length == 0
    g = make_geometry(1, [("attention", 1, True), ("mamba", 1, False), ("mamba", 2, False)])  # make verify's example
    spec = [i.holds for i in iterate_resend(g, "pr53324", Memo())]
    mine = [i.holds for i in iterate_resend(g, m.vary(get_rules("pr53324")), Memo())]
    assert sum(mine) < sum(spec) and not any(b and not a for a, b in zip(spec, mine))


def test_a_refuted_row_keeps_its_measured_count():
    """A refuted efficiency row fails when its refutation count moves (either way), naming both counts; without a
    pinned count (make verify-full) only holds / refuted is judged."""
    from kvspec.checks.verify.manifest import Count, PassPart, PropertyCheck
    part = PassPart(rows={"pr53324": Count(n=100, fails=7, seconds=0.1, bad=[{"command": "kvspec explain …",
                                                                                "what": "h 0 vs best 1"}])})
    for count, ok in ((7, True), (6, False), (8, False), (None, True)):
        (row,) = PropertyCheck(prop="RESEND", rows=(("pr53324", "refuted", count),)).render([part])
        assert row.ok is ok, (count, row)
        if not ok:
            assert f"(measured: {count})" in row.result and "7 refutations where" in row.detail["failures"][0]["what"]


def test_evicting_a_mamba_state_raises_the_vllm_hit():
    """vLLM 0.33.0's rules (MONO-EVICT/vllm-0.33.0, found by MONO-EVICT/z3@vllm-0.33.0): a reader of N = 4 tokens of a
    5-token request; the state at N makes the first lookup reach N, so it is re-derived at N − 1, where the attention
    scan is capped below the block key 4 and nothing is left: h = 0. Evict the state at 4 and the first lookup stops at
    3 with the tail key 4: h = 3. Under hash lookahead the bound is N − 1 from the start (MONO-EVICT proved)."""
    g = make_geometry(1, [("attention", 4, False), ("mamba", 3, False)])
    stored = (StoredRequest(prompt=5, shared=4),)
    assert hit(g, 4, stored, rules="vllm-0.33.0") == 0
    assert hit(g, 4, stored, frozenset({(1, 4, 0)}), rules="vllm-0.33.0") == 3
    assert hit(g, 4, stored, rules="vllm-0.34.0") == 0  # no drafter: 0.34.0 has 0.33.0's rules
