"""Helpers of the live differential tests: build jobs from spec scenarios, compare rank results with the spec."""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from kvspec.checks.conform.adapters import compute_impl_store_rule
from kvspec.impl.job import FaultPlan, Job, ScenarioJob
from kvspec.impl.mooncake_store import OBJECT_NOT_FOUND
from kvspec.impl.worker import make_tokens, request_tokens
from kvspec.spec.failure import compute_safe_boundary
from kvspec.spec.keys import compute_lookahead_chain, render_key
from kvspec.spec.plan import plan_load_keys, plan_store_keys
from kvspec.spec.rules import TAIL_HIT, compute_lookahead
from kvspec.spec.scenario import Scenario, evaluate_scenario
from kvspec.spec.store import compute_rule_deferred, compute_rule_store

MODEL = "kvspec-live"
_ids = itertools.count()


def build_job(master: str, scenarios: list[Scenario], tag: str,
              evict_after_lookup: list[dict[int, list[tuple[int, int]]]] | None = None) -> Job:
    """Return a worker job: every scenario with its tokens' seed and the spec's predicted store keys per rank
    (`evict_after_lookup`: per scenario, rank -> objects removed, forced, between lookup and load)."""
    g = scenarios[0].geometry
    out = []
    for sc in scenarios:
        assert sc.geometry == g
        seed = next(_ids) + 1
        prefix = f"{tag}-{seed}"
        base = make_tokens(seed, sc.prompt)
        predicted: dict[int, list[str]] = {}
        lookahead = compute_lookahead(sc.rules, g)
        for k, r in enumerate(sc.stored):  # each writer under its own rule set (a mixed fleet), else the reader's
            wrules = r.rules or sc.rules
            toks = request_tokens(base, seed * 1000 + k + 1, r.prompt + r.decoded, r.shared)  # prompt, then outputs
            chain = compute_lookahead_chain(toks, g.unit, compute_lookahead(wrules, g))
            objs = compute_rule_store(wrules, g, r.prompt) | compute_rule_deferred(
                wrules, g, r.prompt, r.decoded, decode_saves=r.save_decode_cache)
            for rank, key in plan_store_keys(g, sorted(objs), chain, MODEL, prefix):
                predicted.setdefault(int(rank), []).append(render_key(key))
        writers = tuple((compute_impl_store_rule(r.rules or sc.rules), compute_lookahead(r.rules or sc.rules, g),
                         (r.rules or sc.rules).deferred_saves,
                         (r.rules or sc.rules).decode_states)
                        for r in sc.stored) if any(r.rules for r in sc.stored) else ()
        evict = (evict_after_lookup or [{}] * len(scenarios))[len(out)]
        rs = sc.rules  # the rank job carries the rule set's data, not its name's meaning
        out.append(ScenarioJob(seed=seed, prefix=prefix, prompt=sc.prompt, rules=sc.rules.name, lookahead=lookahead,
                               store_rule=compute_impl_store_rule(sc.rules), tail_at_hit=rs.tail_key == TAIL_HIT,
                               deferred_saves=rs.deferred_saves, decode_states=rs.decode_states,
                               stored=tuple((r.prompt, r.shared, r.decoded, r.save_decode_cache) for r in sc.stored),
                               writers=writers,
                               predicted_keys={r: tuple(ks) for r, ks in predicted.items()},
                               faults=FaultPlan(evict_after_lookup={r: tuple(o) for r, o in evict.items()})))
    return Job(master=master, model=MODEL, geometry=g, scenarios=tuple(out), width=8)


def with_faults(job: Job, k: int, **faults: Any) -> Job:
    """Return the job with scenario k's fault plan changed (FaultPlan's fields)."""
    scs = list(job.scenarios)
    scs[k] = attrs.evolve(scs[k], faults=attrs.evolve(scs[k].faults, **faults))
    return attrs.evolve(job, scenarios=tuple(scs))


def count_redundant_puts(stores: list[dict[str, Any]]) -> int:
    """Return how many puts of one rank and scenario wrote a key it had already put (write-once keeps the first
    value and answers 0, so the store cannot tell; the store path must skip existing keys)."""
    puts = [key for st in stores for key in st["put"]]
    return len(puts) - len(set(puts))


def compare(scenarios: list[Scenario], job: Job, ranks: list[dict[str, Any]]) -> dict[str, int]:
    """Assert impl == spec on stored keys, hit, tails, load keys and bytes; return the byte counts."""
    g = scenarios[0].geometry
    totals = {"bytes_compared": 0, "bytes_wrong": 0, "keys_put": 0, "loads": 0, "minus704": 0, "safe_below_hit": 0,
              "draft_lookahead_bytes": 0}
    for k, sc in enumerate(scenarios):
        js = job.scenarios[k]
        spec = evaluate_scenario(sc)
        base = make_tokens(js.seed, sc.prompt)
        chain = compute_lookahead_chain(base, g.unit, js.lookahead)
        load_keys: dict[int, list[str]] = {}
        for rank, key in plan_load_keys(g, spec.load, chain, MODEL, js.prefix):
            load_keys.setdefault(rank, []).append(render_key(key))
        for res in ranks:
            r = res["rank"]
            got = res["scenarios"][k]
            where = f"scenario {k} rank {r}: {sc!r}"
            predicted = set(js.predicted_keys.get(r, ()))
            put = {key for st in got["stores"] for key in st["put"]}
            assert put <= predicted, f"{where}: put keys outside the prediction: {sorted(put - predicted)[:3]}"
            redundant = count_redundant_puts(got["stores"])
            assert redundant == 0, f"{where}: {redundant} redundant puts (keys put again after they existed)"
            full = sum(st["store_full"] for st in got["stores"])
            assert not got["missing_predicted"] or full, f"{where}: predicted keys missing: {got['missing_predicted'][:3]}"
            assert not [f for st in got["stores"] for f in st["failed"]], f"{where}: store failures"
            assert got["hit"] == spec.hit_length, f"{where}: hit {got['hit']} != spec {spec.hit_length}"
            assert [tuple(t) for t in got["tails"]] == [tuple(t) for t in spec.tails], \
                f"{where}: tails {got['tails']} != spec {spec.tails}"
            assert got["load"]["keys"] == load_keys.get(r, []), f"{where}: load keys differ from the spec's"
            evicted = js.faults.removed_after_lookup  # object -> the rank that lost it
            want_ok = [e.present and evicted.get((e.group, e.key_boundary), -1) != r for e in spec.load]
            got_ok = [rc >= 0 for rc in got["load"]["results"]]
            assert got_ok == want_ok, f"{where}: load results {got['load']['results']} vs expected {want_ok}"
            all_ok = [e.present and (e.group, e.key_boundary) not in evicted for e in spec.load]
            spec_safe = compute_safe_boundary(g, spec.present, spec.hit_length, spec.load, all_ok)
            assert got["safe"] == spec_safe, f"{where}: safe boundary {got['safe']} != spec {spec_safe}"
            assert got["bytes_wrong"] == 0, f"{where}: {got['bytes_wrong']} wrong bytes"
            totals["bytes_compared"] += got["bytes_compared"]
            totals["bytes_wrong"] += got["bytes_wrong"]
            totals["draft_lookahead_bytes"] += got["draft_lookahead_bytes"]
            totals["keys_put"] += len(put)
            totals["loads"] += len(got["load"]["keys"])
            totals["minus704"] += sum(rc == OBJECT_NOT_FOUND for rc in got["load"]["results"])
            totals["safe_below_hit"] += got["safe"] < got["hit"]
    return totals


def run(master, scenarios, tmp_path, tag, evict_after_lookup=None, env=None, faults=None):
    """Run the scenarios on real rank processes against `master`; print and return the comparison totals (`faults`:
    FaultPlan fields set on every scenario)."""
    job = build_job(master.address, scenarios, tag, evict_after_lookup)
    for k in range(len(scenarios)) if faults else ():
        job = with_faults(job, k, **faults)
    from kvspec.impl import cluster  # needs torch and the Mooncake wheel (the live tests check both)
    ranks = cluster.run_ranks(job, scenarios[0].geometry.parallel.dcp, timeout_s=600, workdir=str(tmp_path), env=env)
    totals = compare(scenarios, job, ranks)
    totals["staged_ranks"] = sum(bool(r.get("staging")) for r in ranks)
    print(f"[{tag}] {len(scenarios)} scenarios x {len(ranks)} ranks: bytes compared {totals['bytes_compared']}, "
          f"bytes wrong {totals['bytes_wrong']} (+{totals['draft_lookahead_bytes']} draft-lookahead), "
          f"keys put {totals['keys_put']}, loads {totals['loads']}, "
          f"-704 {totals['minus704']}")
    return totals
