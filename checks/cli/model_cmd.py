"""`kvspec model`: one scenario on the tiny real model (impl/tiny_model.py) — D rank processes with real DCP
attention over a real mooncake_master on 127.0.0.1 — printed as an engine developer reads it: the hit (and what
`kvspec explain` says), what each rank loaded, cold and warm tokens, bitwise equal or the first differing
position, draft acceptance, and where the time went."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from kvspec.checks.conform.adapters import compute_impl_store_rule
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, has_eagle
from kvspec.spec.rules import TAIL_HIT, compute_lookahead, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, evaluate_scenario

RULE_MODEL_LIMIT = "limit-model"
MAX_TOKENS = 4096  # the tiny model scans token by token in Python: beyond this a run takes minutes
MAX_DCP = 8


def run_model_command(geometry: Geometry, rules: str, stored: int, shared: int, prompt: int,
                      json_out: bool = False) -> int:
    """Run one scenario on the model and print the report; return 0 when warm == cold bitwise, else 1."""
    if max(stored, prompt) > MAX_TOKENS or geometry.parallel.dcp > MAX_DCP or geometry.parallel.pcp != 1:
        raise SpecError(RULE_MODEL_LIMIT, f"the tiny model runs prompts up to {MAX_TOKENS} tokens on up to {MAX_DCP} "
                                          f"DCP ranks without PCP (got P = {stored}, N = {prompt}, "
                                          f"D = {geometry.parallel.dcp}, PCP = {geometry.parallel.pcp}); scale the "
                                          f"geometry down (e.g. --unit 4 --group attention:8:eagle --group mamba:8)")
    if not any(g.kind == "attention" for g in geometry.groups):
        raise SpecError(RULE_MODEL_LIMIT, "the tiny model needs an attention group (its MLA-style layer)")
    sc = Scenario(geometry=geometry, prompt=prompt, stored=(StoredRequest(prompt=stored, shared=shared),), rules=rules)
    spec = evaluate_scenario(sc)
    if spec.error is not None:
        raise spec.error
    from kvspec.impl.cluster import run_ranks, running_master
    from kvspec.impl.job import Job, ScenarioJob
    rs = get_rules(rules)
    job_sc = ScenarioJob(seed=1, prefix="kvspec-model", prompt=prompt, rules=rules,
                         store_rule=compute_impl_store_rule(rules), tail_at_hit=rs.tail_key == TAIL_HIT,
                         lookahead=compute_lookahead(rs, geometry), stored=((stored, shared, 0, False),))
    with tempfile.TemporaryDirectory(prefix="kvspec-model-") as wd, running_master(wd) as master:
        job = Job(master=master.address, geometry=geometry, model="tiny-hybrid", scenarios=(job_sc,))
        ranks = [r["scenarios"][0] for r in run_ranks(job, geometry.parallel.dcp, timeout_s=600, workdir=wd,
                                                       module="kvspec.impl.model_worker")]
    report = _report(sc, spec.hit_length, ranks)
    if json_out:
        print(json.dumps(report))
    else:
        print(format_model_report(report))
    return 0 if report["equal"] else 1


def _report(sc: Scenario, spec_hit: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    r0 = ranks[0]
    return {"scenario": {"rules": sc.rules.name, "stored": sc.stored[0].prompt, "shared": sc.stored[0].shared,
                         "prompt": sc.prompt, "dcp": sc.geometry.parallel.dcp, "eagle": has_eagle(sc.geometry)},
            "hit": r0["hit"], "spec_hit": spec_hit, "start": r0["start"], "attempts": r0["attempts"],
            "loaded": [{"rank": k, "keys": r["attempts"][-1]["keys"] if r["attempts"] else 0,
                        "bytes": r["attempts"][-1]["bytes"] if r["attempts"] else 0} for k, r in enumerate(ranks)],
            "cold_tokens": r0["cold_tokens"], "warm_tokens": r0["warm_tokens"], "equal": r0["equal"],
            "first_prefill_difference": r0["first_prefill_difference"],
            "first_decode_difference": r0["first_decode_difference"],
            "acceptance": {"warm": r0["warm_acceptance"], "cold": r0["cold_acceptance"]},
            "seconds": r0["seconds"]}


def format_model_report(rep: dict[str, Any]) -> str:
    """Return the report as text."""
    s = rep["scenario"]
    lines = [f"kvspec model: tiny hybrid (Mamba2-style + MLA-style attention{' + EAGLE draft' if s['eagle'] else ''}), "
             f"{s['dcp']} DCP rank process(es), a real mooncake_master on 127.0.0.1",
             f"rules {s['rules']}: stored {s['stored']} tokens sharing {s['shared']}; lookup {s['prompt']} tokens",
             f"hit {rep['hit']} (kvspec explain: {rep['spec_hit']}, {'equal' if rep['hit'] == rep['spec_hit'] else 'DIFFERENT'}"
             f"); computed from {rep['start']}"]
    for k, a in enumerate(rep["attempts"]):
        lines.append(f"  load attempt {k + 1}: hit {a['hit']}, " + (f"{len(a['failed'])} key(s) missing on rank 0, "
                     "closed and retried below the safe boundary" if a["failed"] else "every block loaded"))
    lines += [f"  rank {x['rank']}: loaded {x['keys']} key(s), {x['bytes']} bytes" for x in rep["loaded"]]
    lines += [f"cold tokens: {rep['cold_tokens']}", f"warm tokens: {rep['warm_tokens']}"]
    if rep["equal"]:
        lines.append(f"warm == cold: bitwise equal (logits of positions {rep['start']}..{s['prompt'] - 1} and every "
                     f"decode step)")
    else:
        where = (f"position {rep['first_prefill_difference']}" if rep["first_prefill_difference"] is not None
                 else f"decode step {rep['first_decode_difference']}")
        lines.append(f"warm != cold: first differing logits at {where}")
    acc = rep["acceptance"]
    if s["eagle"]:
        lines.append(f"draft acceptance: warm {acc['warm'][0]}/{acc['warm'][1]}, cold {acc['cold'][0]}/{acc['cold'][1]}")
    t = rep["seconds"]
    lines.append(f"time (rank 0): lookup {1000 * t['lookup']:.1f} ms, load {1000 * t['load']:.1f} ms, warm compute "
                 f"{1000 * t['warm_compute']:.1f} ms, cold compute {1000 * t['cold_compute']:.1f} ms")
    return "\n".join(lines)

