"""Issue 30: the spec past the explicit limit, on runs and points (spec/boundaries.py), equals the explicit spec.

The 1M-token, block-16 question is answered (it was refused by limit-shards); at sizes both forms can do, the
compact evaluation (forced) gives the explicit one's E, hit, tails, load plan and error; the CLI prints runs, the
JSON has a compact form (schemas/outcome.schema.json) and --explicit lists it all. `make verify`'s COMPACT/<rules>
rows run the same cross-check over the registry scope.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given

from kvspec.checks.cli.main import main
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import make_geometry
from kvspec.spec.limits import RULE_LIMIT_CHUNKS, RULE_LIMIT_EVICTED
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario, is_compact
from kvspec.spec.schedule import Schedule

from .support.strategies import scenarios

ISSUE = ["explain", "--dcp", "1", "--unit", "16", "--group", "attention:16", "--group", "mamba:16",
         "--stored-prompt", "1000000", "--prompt", "1000000"]


def same(sc: Scenario) -> None:
    explicit, compact = evaluate_scenario(sc, compact=False), evaluate_scenario(sc, compact=True)
    assert frozenset(compact.present) == explicit.present
    assert (compact.hit_length, compact.tails) == (explicit.hit_length, explicit.tails)
    assert tuple(e for r in compact.load_runs or () for e in r.entries()) == explicit.load
    assert (compact.error and compact.error.rule) == (explicit.error and explicit.error.rule)


@given(scenarios())
def test_compact_equals_explicit(sc):
    """Every rule set, 1-3 stored requests, evictions, chunk schedules: the two forms answer alike."""
    same(sc)


@pytest.mark.parametrize("rules", ["vllm-0.34.0", "vllm-0.33.0", "pr53324", "legacy", "sglang-0.5.23"])
def test_compact_equals_explicit_at_the_explicit_limit(rules):
    """Kimi-K3 at DCP 8 and the issue's block-16 geometry, a few hundred thousand tokens, shared prefixes, an eviction
    and (vLLM rule sets) vLLM serve's default chunk budget."""
    for g, n in ((get_preset("kimi-k3-dcp8"), 1_000_000), (make_geometry(16, [("attention", 16, False),
                                                                                ("mamba", 16, False)]), 250_000)):
        stored = (StoredRequest(prompt=n, shared=n), StoredRequest(prompt=n + 5000, shared=n // 2 + 77))
        evicted = frozenset({(0, 3 * (n // 7) // 16 * 16 if g.unit == 16 else 12288 * 9, 0)})
        for sched in (Schedule(), Schedule(budget=8192)) if rules.startswith("vllm") else (Schedule(),):
            for ev in (frozenset(), evicted):
                try:
                    sc = Scenario(geometry=g, prompt=n, stored=stored, evicted=ev, rules=rules, schedule=sched)
                except SpecError as err:  # SGLang's configuration refuses Kimi-K3's grid
                    assert err.rule.startswith("sglang-"), err
                    continue
                same(sc)


def test_the_million_token_question_is_answered(capsys):
    """The issue's question: refused before (limit-shards: prompts up to 262112 tokens on this geometry), now answered
    on runs, with the hit the explicit spec gives when its limit is lifted (999984)."""
    assert main(ISSUE) == 0
    out = capsys.readouterr().out
    assert "hit length: 999984" in out and "every 16 from 16 to 1000000 (62500)" in out
    assert "group 0 blocks 0..62498: [0, 999984), each keyed at its block end, block 62498 at 999984; all present" in out
    assert main([*ISSUE, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["form"] == "compact" and d["hit_length"] == 999984
    assert d["stored"][0] == {"group": 0, "runs": [[16, 16, 1000000]], "points": [], "evicted": []}
    assert d["load"][0] == {"group": 0, "first_block": 0, "last_block": 62498, "span": 16, "tail_key": 999984,
                            "absent_blocks": []}
    assert main([*ISSUE, "--json", "--explicit"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "form" not in listed and len(listed["stored"]) == 62501 and len(listed["load"]) == 62500
    assert listed["load"][-1] == {"group": 1, "block": 62498, "start": 999968, "end": 999984, "key_boundary": 999984,
                                  "present": True}


def test_pictures_past_the_explicit_limit_are_refused(capsys, tmp_path):
    for extra in (["--svg", str(tmp_path / "x.svg")], ["--ranks"]):
        with pytest.raises(SystemExit) as exc:
            main([*ISSUE, *extra])
        assert exc.value.code == 2 and "limit-shards" in capsys.readouterr().err
    assert not (tmp_path / "x.svg").exists()


def test_compact_limits_are_named():
    g = make_geometry(16, [("attention", 16, False), ("mamba", 16, False)])
    big = (StoredRequest(prompt=10**7, shared=10**7),)
    assert is_compact(Scenario(geometry=g, prompt=10**7, stored=big))
    with pytest.raises(SpecError) as exc:
        Scenario(geometry=g, prompt=10**7, stored=big, evicted=frozenset((0, 16 * k, 0) for k in range(1, 40_000)))
    assert exc.value.rule == RULE_LIMIT_EVICTED
    with pytest.raises(SpecError) as exc:
        Scenario(geometry=g, prompt=10**7, stored=big, schedule=Schedule(budget=16))
    assert exc.value.rule == RULE_LIMIT_CHUNKS
    # a schedule that needs at least P / min(budget, threshold) chunks is refused before one is cut (the held-out fuzz:
    # such refusals took 0.5-0.7 s of CPU cutting 32,768 chunks first); one that needs fewer is cut and counted
    for sched in (Schedule(budget=8192, long_prefill_threshold=3), Schedule(budget=1)):
        t0 = time.process_time()
        with pytest.raises(SpecError) as exc:
            Scenario(geometry=g, prompt=10**7, stored=big, schedule=sched)
        assert exc.value.rule == RULE_LIMIT_CHUNKS and time.process_time() - t0 < 0.1
    with pytest.raises(SpecError) as exc:  # 64 tokens a step, but a stop every 2 tokens: counted as they are cut
        Scenario(geometry=g, prompt=10**6, stored=(StoredRequest(prompt=10**6, shared=10**6),),
                 schedule=Schedule(budget=64, stop_every=2))
    assert exc.value.rule == RULE_LIMIT_CHUNKS


@pytest.mark.parametrize("rules", ["vllm-0.34.0", "vllm-0.33.0", "pr53324", "legacy"])
def test_block_sizes_with_a_large_common_multiple(rules):
    """The held-out fuzz (tools/fuzz_explain.py): a 4096-token MLA group at D = 8 beside 2-token blocks (L = 32768)
    was refused past the explicit limit (limit-shards: 16,384 block ends of the tail's L-block per request, listed as
    points); those block ends continue the run of whole spans (spec/store.py), so it is answered on runs — equal to
    the explicit spec at sizes both can do, and at 10^7 tokens within the CPU budget."""
    g = make_geometry(1, [("attention", 4096, True), ("attention", 2, False), ("mamba", 2, False)], dcp=8,
                      retention="dense")
    for n in (40_000, 70_001, 98_305):
        stored = (StoredRequest(prompt=n, shared=n - 3), StoredRequest(prompt=n + 9, shared=n // 2 + 7))
        same(Scenario(geometry=g, prompt=n, stored=stored, rules=rules))
    big = (StoredRequest(prompt=10**7, shared=10**7 - 5),) * 2 + (StoredRequest(prompt=10**7 + 3, shared=77_777),)
    sc = Scenario(geometry=g, prompt=10**7, stored=big, rules=rules)
    assert is_compact(sc) and evaluate_scenario(sc).hit_length > 0
