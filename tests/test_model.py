"""The tiny real hybrid model end to end (issue 31): real DCP attention across rank processes, its caches stored,
looked up and loaded through impl/ on a real mooncake_master; after a hit it computes and generates exactly what a
cold run does (bitwise), under every rule set that should be safe, and broken loaders are caught."""

from __future__ import annotations

import attrs
import pytest
import torch

from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario

from .conftest import require

pytestmark = pytest.mark.live
cluster = require("kvspec.impl.cluster")

from kvspec.impl.tiny_model import HEAD_DIM, HEADS, attend_partial, merge_partials  # noqa: E402

from .support.live import build_job  # noqa: E402

SAFE = ("pr53324", "vllm-0.33.0", "vllm-0.33.0-lookahead", "vllm-0.34.0")
MODULE = "kvspec.impl.model_worker"


def geometry(d: int, draft: bool = False, two_mamba: bool = False, retention: str = "replay") -> Geometry:
    """Return the Kimi-like shape scaled down: u = 4, attention 8 with EAGLE (or a draft group of its own), Mamba 8
    (and Mamba 16)."""
    groups = [Group(kind="attention", block_size=8, eagle=not draft)]
    if draft:
        groups.append(Group(kind="attention", block_size=8, eagle=True))
    groups.append(Group(kind="mamba", block_size=8))
    if two_mamba:
        groups.append(Group(kind="mamba", block_size=16))
    return Geometry(unit=4, groups=tuple(groups), parallel=Parallel(dcp=d), retention=retention)


def cases(g: Geometry, rules: tuple[str, ...]) -> list[Scenario]:
    """Return, per rule set: the same prompt, a longer one, and a shared prefix with a different continuation."""
    return [Scenario(geometry=g, prompt=n, stored=(StoredRequest(prompt=p, shared=s),), rules=r)
            for r in rules for p, n, s in ((70, 70, 70), (50, 90, 50), (80, 90, 61))]


def run_model(master, scenarios: list[Scenario], tmp_path, tag: str, wrong_load: str | None = None,
              evict: list[dict[int, list[tuple[int, int]]]] | None = None) -> list[dict]:
    """Run the scenarios on D model rank processes (each loader broken as `wrong_load` says: FaultPlan); return rank
    0's results (after checking every rank agrees)."""
    job = build_job(master.address, scenarios, tag, evict)
    job = attrs.evolve(job, model="tiny-hybrid", scenarios=tuple(
        attrs.evolve(s, seed=100 + k, faults=attrs.evolve(s.faults, wrong_load=wrong_load))
        for k, s in enumerate(job.scenarios)))
    d = scenarios[0].geometry.parallel.dcp
    ranks = cluster.run_ranks(job, d, timeout_s=300, workdir=str(tmp_path / tag), module=MODULE)
    for r in ranks[1:]:  # every rank merged the same attention: the same logits and tokens
        for a, b in zip(ranks[0]["scenarios"], r["scenarios"]):
            assert (a["warm_tokens"], a["cold_last_logits"], a["start"]) == \
                   (b["warm_tokens"], b["cold_last_logits"], b["start"])
    return ranks[0]["scenarios"]


def test_dcp_merge_equals_one_softmax():
    """The LSE merge of per-shard partial attention (any split, empty shards included) equals attention over the
    whole context, within fp32 rounding."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, HEADS, HEAD_DIM, generator=gen)
    k, v = torch.randn(23, HEADS, HEAD_DIM, generator=gen), torch.randn(23, HEADS, HEAD_DIM, generator=gen)
    whole, _ = attend_partial(q, k, v, causal=False)
    for cuts in ((0, 23), (0, 7, 7, 23), (0, 1, 2, 3, 23), (0, 23, 23)):
        parts = [attend_partial(q, k[a:b], v[a:b], causal=False) for a, b in zip(cuts, cuts[1:])]
        assert torch.allclose(merge_partials(parts), whole, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(merge_partials([attend_partial(q, k[:7], v[:7], causal=False)]), whole, atol=1e-3)


@pytest.mark.parametrize("d", [1, 2, 4])
def test_warm_equals_cold_bitwise_under_every_safe_rule_set(master, tmp_path, d):
    """Per D: every safe rule set, three request shapes, and a resend whose last target block lost rank D−1's shard
    between lookup and load: the warm run's logits from its start on, and its tokens, equal the cold run's bitwise;
    the hit is what `kvspec explain` says; the legacy loader (tail key at the hit: -704) closes and retries down to a
    cold start and still ends equal."""
    g = geometry(d)
    scs = cases(g, SAFE if d == 4 else ("vllm-0.33.0", "vllm-0.34.0")) + cases(g, ("legacy",))[:1]
    resend = Scenario(geometry=g, prompt=70, stored=(StoredRequest(prompt=70, shared=70),), rules="vllm-0.34.0")
    out = run_model(master, [*scs, resend], tmp_path, f"model-d{d}",
                    evict=[{}] * len(scs) + [{d - 1: [(0, 8 * d)]}])
    for sc, res in zip(scs, out):
        assert res["equal"], (sc.rules, sc.stored, res["first_prefill_difference"], res["first_decode_difference"])
        assert res["hit"] == evaluate_scenario(sc).hit_length, (sc.rules, sc.stored)
        if sc.rules.name == "legacy" and res["hit"] > 0:  # keyed at the hit: -704 under DCP, the closure, retries
            assert res["start"] < res["hit"] and len(res["attempts"]) >= 2
        else:
            assert res["start"] == res["hit"] > 0 or res["hit"] == 0
    last = out[-1]
    assert last["equal"] and last["evicted_rc"] in ([], [0]) and 0 <= last["start"] < last["hit"]


def test_dcp_matches_the_single_rank_model(master, tmp_path):
    """The same request on 1, 2 and 4 ranks: the merged attention is the single-rank model's within fp32 rounding
    (the merge order differs, so not bitwise), and a geometry with a draft group of its own and two Mamba sizes
    (two Mamba layers) runs warm == cold too."""
    logits = []
    for d in (1, 2, 4):
        sc = Scenario(geometry=geometry(d), prompt=90, stored=(StoredRequest(prompt=50, shared=50),),
                      rules="vllm-0.34.0")
        logits.append(torch.tensor(run_model(master, [sc], tmp_path, f"ref-d{d}")[0]["cold_last_logits"]))
    assert all(torch.allclose(x, logits[0], rtol=1e-4, atol=1e-4) for x in logits[1:])
    g = geometry(2, draft=True, two_mamba=True, retention="dense")
    for res in run_model(master, cases(g, ("vllm-0.33.0", "vllm-0.34.0")), tmp_path, "draft-two-mamba"):
        assert res["equal"] and res["start"] == res["hit"]


@pytest.mark.parametrize("mutant", ["neighbour", "skip-mamba"])
def test_a_wrong_load_changes_the_logits(master, tmp_path, mutant):
    """A loader that puts the previous block's object where the last target block belongs, or starts from the
    initial Mamba state, is caught: the logits differ from the cold run's, at the first computed position."""
    g = geometry(2)
    out = run_model(master, cases(g, ("vllm-0.34.0",)), tmp_path, f"mutant-{mutant}", wrong_load=mutant)
    mutated = [r for r in out if r["mutated"]]
    assert mutated
    for r in mutated:
        assert not r["equal"] and r["first_prefill_difference"] == r["start"]


def test_draft_kv_hazard_end_to_end(master, tmp_path):
    """The draft-KV hazard on the real model (spec/README.md): a first writer's prompt ends at P1 (its draft row at
    P1 − 1 saw its sampled token), a second writer extends it, the reader's hit passes P1. Under the legacy hashes
    (vllm-0.33.0, pr53324) the loaded draft row at P1 − 1 differs from what the reader computes, in every scenario;
    the target's tokens never change (speculation is verified), but the draft proposes differently, so the decode
    is not bitwise the cold run's in some scenarios (the verify chunks differ) and acceptance moves. Under
    vllm-0.34.0's lookahead keys nothing differs."""
    g = Geometry(unit=1, groups=(Group(kind="attention", block_size=1, eagle=True), Group(kind="mamba", block_size=1)),
                 parallel=Parallel(dcp=1), retention="dense")
    rules = ("vllm-0.33.0", "pr53324", "vllm-0.34.0")
    scs = [Scenario(geometry=g, prompt=p2 + 4, stored=(StoredRequest(prompt=p1, shared=p1),
                                                       StoredRequest(prompt=p2, shared=p2)), rules=r)
           for r in rules for p1 in range(2, 12) for p2 in (p1 + 2, p1 + 6)]
    out = run_model(master, scs, tmp_path, "hazard")
    table = {r: {"scenarios": 0, "draft_rows_differ": 0, "tokens_differ": 0, "not_bitwise": 0, "warm_accepted": 0,
                 "cold_accepted": 0, "warm_proposed": 0, "cold_proposed": 0} for r in rules}
    for sc, res in zip(scs, out):
        t = table[sc.rules.name]
        t["scenarios"] += 1
        t["draft_rows_differ"] += res["rows_differ"]["draft"] == [sc.stored[0].prompt - 1]
        assert res["rows_differ"]["draft"] in ([], [sc.stored[0].prompt - 1]) and res["rows_differ"]["target"] == []
        t["tokens_differ"] += res["warm_tokens"] != res["cold_tokens"]
        t["not_bitwise"] += not res["equal"]
        for k, w in (("warm", "warm_acceptance"), ("cold", "cold_acceptance")):
            t[f"{k}_accepted"] += res[w][0]
            t[f"{k}_proposed"] += res[w][1]
    print(f"draft-KV hazard on the tiny model: {table}")
    for r in ("vllm-0.33.0", "pr53324"):
        assert table[r]["draft_rows_differ"] == table[r]["scenarios"] and table[r]["tokens_differ"] == 0
    assert table["vllm-0.33.0"]["not_bitwise"] > 0
    fixed = table["vllm-0.34.0"]
    assert fixed["draft_rows_differ"] == fixed["tokens_differ"] == fixed["not_bitwise"] == 0
    assert (fixed["warm_accepted"], fixed["warm_proposed"]) == (fixed["cold_accepted"], fixed["cold_proposed"])


def test_model_command(capsys):
    """`kvspec model` runs one scenario and prints the hit beside explain's, the loads per rank, cold and warm
    tokens and the verdict (exit 0 when bitwise equal); a prompt past the model's limit is refused (exit 2)."""
    from kvspec.checks.cli.main import main
    argv = ["model", "--unit", "4", "--group", "attention:8:eagle", "--group", "mamba:8", "--dcp", "2",
            "--retention", "dense", "--stored-prompt", "80", "--shared", "61", "--prompt", "90", "--rules",
            "vllm-0.34.0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "hit 48 (kvspec explain: 48, equal); computed from 48" in out
    assert "rank 1: loaded 4 key(s)" in out and "warm == cold: bitwise equal" in out and "draft acceptance" in out
    with pytest.raises(SystemExit) as exc:
        main(["model", "--preset", "kimi-k3-dcp8", "--stored-prompt", "15000", "--prompt", "15000"])
    assert exc.value.code == 2 and "limit-model" in capsys.readouterr().err
