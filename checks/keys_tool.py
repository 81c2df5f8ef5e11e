"""`kvspec keys parse` and `kvspec keys check`: read store keys as an operator has them.

`check` takes a newline list of keys (what `mooncake_master`'s /get_all_keys returns), groups them
by object (namespace, group, block hash), and says for each object which DCP ranks hold it and which
lack it — an object is in E, the present set the lookup sees, only when every rank holds it. Given
the request's token ids it maps each hash to its boundary t (H_t of the chain) and runs the spec on
the resulting E: the hit, the tail keys and the load plan, each key marked present or missing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kvspec.spec.errors import SpecError, require
from kvspec.spec.geometry import Geometry
from kvspec.spec.keys import StoreKey, compute_hash_chain, parse_key
from kvspec.spec.scenario import Scenario, encode_outcome, evaluate_scenario
from kvspec.spec.types import Boundary, GroupId

RULE_KEY = "key-grammar"
GRAMMARS = ("kvspec", "vllm-0.33.0")


def parse_key_vllm(text: str) -> tuple[StoreKey, list[tuple[str, str]]]:
    """Return a key in vLLM 0.33.0's grammar (fields read from the right) and every (cache_prefix, model) split.

    vLLM joins prefix, model and fields with '@' without escaping, so a head containing '@' has several
    readings; the StoreKey returned takes the whole head as the model.
    """
    parts = text.split("@")
    require(len(parts) >= 7, RULE_KEY, f"expected at least 7 '@'-separated fields, got {len(parts)}")
    head = parts[:-6]
    require(all(head) or len(head) == 1, RULE_KEY, "an empty cache prefix or model field")
    # the six fixed fields are the same in both grammars: kvspec's parser checks them (a stand-in model)
    fixed = parse_key("@".join(["m", *parts[-6:]]))
    splits = [("@".join(head[:k]), "@".join(head[k:])) for k in range(len(head))]
    return attrs.evolve(fixed, model="@".join(head)), splits


def parse_any(text: str, grammar: str) -> StoreKey:
    """Return the key of one line in the given grammar."""
    return parse_key(text) if grammar == "kvspec" else parse_key_vllm(text)[0]


def compute_key_report(geometry: Geometry, lines: Iterable[str], grammar: str = "kvspec",
                       tokens: Sequence[int] | None = None, rules: str = "vllm-0.33.0") -> dict[str, Any]:
    """Return the report of a key dump: objects with the ranks holding and lacking them, bad lines, and
    (given the token ids) boundaries and the spec's outcome on the objects every rank holds."""
    require(grammar in GRAMMARS, "key-grammar", f"unknown grammar {grammar!r} (known: {', '.join(GRAMMARS)})")
    d = geometry.parallel.dcp
    holders: dict[tuple[str, str, int, int, str], set[int]] = defaultdict(set)
    bad: list[dict[str, Any]] = []
    n = 0
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        n += 1
        try:
            k = parse_any(line, grammar)
        except SpecError as err:
            bad.append({"line": lineno, "rule": err.rule, "message": err.message})
            continue
        if k.dcp_rank >= d or k.group >= len(geometry.groups):
            bad.append({"line": lineno, "rule": "key-range",
                        "message": f"dcp_rank {k.dcp_rank} / group {k.group} outside this geometry (D={d}, "
                                   f"{len(geometry.groups)} groups)"})
            continue
        holders[(k.cache_prefix, k.model, k.pp_rank, k.group, k.hash_hex)].add(k.dcp_rank)
    boundary_of: dict[str, int] = {}
    if tokens is not None:
        chain = compute_hash_chain(tokens, geometry.unit)
        boundary_of = {h.hex(): (i + 1) * geometry.unit for i, h in enumerate(chain)}
    objects: list[dict[str, Any]] = []
    for (prefix, model, pp, group, h), ranks in sorted(holders.items(), key=lambda x: (x[0][3], boundary_of.get(x[0][4], 0),
                                                                                        x[0][4])):
        missing = sorted(set(range(d)) - ranks)
        objects.append({"cache_prefix": prefix, "model": model, "pp_rank": pp, "group": group, "hash_hex": h,
                        "boundary": boundary_of.get(h), "ranks": sorted(ranks), "missing_ranks": missing,
                        "in_present_set": not missing})
    report: dict[str, Any] = {"keys": n, "bad_lines": bad, "objects": objects,
                              "complete_objects": sum(o["in_present_set"] for o in objects)}
    if tokens is not None:
        present = {(GroupId(o["group"]), Boundary(o["boundary"])) for o in objects
                   if o["in_present_set"] and o["boundary"] is not None}
        report["unmatched_hashes"] = sum(o["boundary"] is None for o in objects)
        if tokens:
            top = len(tokens) // geometry.unit * geometry.unit
            sc = Scenario(geometry=geometry, prompt=len(tokens), objects=frozenset(x for x in present if x[1] <= top),
                          rules=rules)
            out = encode_outcome(sc, evaluate_scenario(sc))
            out.pop("input")
            report["outcome"] = out
    return report


def format_key_report(report: dict[str, Any]) -> str:
    """Return the readable report of `kvspec keys check`."""
    lines = [f"{report['keys']} keys, {len(report['objects'])} objects, {report['complete_objects']} held by every "
             f"rank (in E), {len(report['bad_lines'])} lines that are not keys"]
    for b in report["bad_lines"][:20]:
        lines.append(f"  line {b['line']}: {b['rule']}: {b['message']}")
    for o in report["objects"]:
        where = f"t={o['boundary']}" if o["boundary"] is not None else f"hash {o['hash_hex'][:12]}…"
        state = "in E" if o["in_present_set"] else f"NOT in E: ranks {o['missing_ranks']} lack it"
        lines.append(f"  group {o['group']} {where}: ranks {o['ranks']} — {state}")
    if "outcome" in report:
        out = report["outcome"]
        lines.append(f"lookup of {out['prompt']} tokens ({out['rules']}): hit {out['hit_length']}; tails "
                     + (", ".join(f"group {t['group']} @ {t['boundary']}" for t in out["tail_boundaries"]) or "none"))
        for e in out["load"]:
            lines.append(f"  load group {e['group']} block {e['block']} [{e['start']}, {e['end']}) key t={e['key_boundary']}"
                         f": {'present' if e['present'] else 'MISSING (-704)'}")
        if out["error"]:
            lines.append(f"error: {out['error']['rule']}: {out['error']['message']}")
    return "\n".join(lines)
