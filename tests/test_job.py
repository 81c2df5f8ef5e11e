"""The typed rank job: JSON only at the process boundary, decoded strictly (a bad field is named)."""

from __future__ import annotations

import json

import pytest

from kvspec.impl.job import FaultPlan, Job, JobError, ScenarioJob, TransferPlan, decode_job, encode_job
from kvspec.spec.geometry import Geometry, Group, Parallel

GEOMETRY = Geometry(unit=4, groups=(Group(kind="attention", block_size=16, eagle=True), Group(kind="mamba", block_size=16)),
                    parallel=Parallel(dcp=2), retention="dense")


def full_job() -> Job:
    faults = FaultPlan(evict_before_lookup={1: ("k1",)}, crash_after_store=1, evict_after_lookup={0: ((0, 52),)},
                       evict_force=False, evict_after_lookup_unforced={1: ((1, 48),)}, hold_before_load="/tmp/x",
                       relookup=True, wrong_load="skip-mamba")
    sc = ScenarioJob(seed=3, prefix="p-3", prompt=57, rules="vllm-0.33.0-lookahead", lookahead=1,
                     store_rule="checkpoint", tail_at_hit=True, stored=((57, 57, 0, False), (80, 40, 3, True)),
                     deferred_saves=True, decode_states=True,
                     predicted_keys={0: ("a", "b"), 1: ("c",)}, faults=faults)
    return Job(master="127.0.0.1:1234", geometry=GEOMETRY, model="m", width=4, store_rule="checkpoint", lookahead=1,
               segment_bytes=16 << 20, concurrency=3, scenarios=(sc,),
               transfer=TransferPlan(tokens=64, mamba_width=2, repeats=1))


def test_job_round_trips_through_json():
    job = full_job()
    assert decode_job(json.loads(json.dumps(encode_job(job)))) == job
    bare = Job(master="m", geometry=GEOMETRY)
    assert decode_job(json.loads(json.dumps(encode_job(bare)))) == bare


def test_scenario_job_carries_the_rule_sets_data_not_its_name():
    """impl/ reads what the rule set does (store rule, tail key, λ), set by the harness from the rule set's fields;
    the name is only reported."""
    from kvspec.checks.conform.adapters import compute_impl_store_rule
    sc = full_job().scenarios[0]
    assert (sc.store_rule, sc.tail_at_hit, sc.lookahead) == ("checkpoint", True, 1)
    assert ScenarioJob(seed=1, prefix="x", prompt=9, rules="anything").store_rule == "prompt-tail"  # the default
    assert [compute_impl_store_rule(r) for r in ("legacy", "pr53324", "vllm-0.33.0", "vllm-0.34.0")] == \
        ["prompt-tail", "prompt-tail", "checkpoint", "checkpoint"]  # impl/'s own vocabulary, not rule-set names


def test_removed_after_lookup_leaves_out_the_unforced_removals():
    assert full_job().scenarios[0].faults.removed_after_lookup == {(0, 52): 0}


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("master"), "job: missing master"),
    (lambda d: d.update(evil=1), "job: unknown evil"),
    (lambda d: d["scenarios"][0].update(sync_dir="/tmp"), "scenario 0: unknown sync_dir"),
    (lambda d: d["scenarios"][0]["faults"].update(crash=1), "scenario 0 faults: unknown crash"),
    (lambda d: d["scenarios"][0]["faults"].update(wrong_load="mamba"), "scenario 0 faults: wrong_load must be one of"),
    (lambda d: d["scenarios"][0].pop("seed"), "scenario 0: missing seed"),
    (lambda d: d["transfer"].pop("repeats"), "transfer: missing repeats"),
    (lambda d: d.update(scenarios=[[]]), "scenario 0 must be a JSON object"),
])
def test_a_bad_job_is_refused_naming_the_field(mutate, message):
    raw = encode_job(full_job())
    mutate(raw)
    with pytest.raises(JobError, match=message):
        decode_job(raw)
