"""`kvspec keys parse` and `kvspec keys check`: read store keys as an operator has them.

`check` takes a newline list of keys (what `mooncake_master`'s /get_all_keys returns), groups them
by object (namespace, group, block hash), and says for each object which DCP ranks hold it and which
lack it — an object is in E, the present set the lookup sees, only when every rank holds it. Given
the request's token ids it maps each hash to its boundary t (H_t of the chain) and runs the spec on
the resulting E: the hit, the tail keys and the load plan, each key marked present or missing.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kvspec.spec.errors import SpecError, require
from kvspec.spec.geometry import Geometry
from kvspec.spec.keys import KEY_GRAMMARS, StoreKey, compute_lookahead_chain, parse_key
from kvspec.spec.rules import VLLM_0_33, compute_lookahead, get_rules
from kvspec.spec.scenario import Scenario, encode_outcome, evaluate_scenario
from kvspec.spec.types import Boundary, GroupId

RULE_KEY = "key-grammar"
RULE_HASH = "hash-algo"
GRAMMARS = tuple(KEY_GRAMMARS)
# `--hash-algo`: kvspec's own chain (spec/keys.py), or vLLM's prefix-caching hash (its `prefix_caching_hash_algo`)
HASH_ALGOS = ("kvspec", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
VLLM_DEFAULT_SEED = "vllm-none-hash"  # vLLM's NONE_HASH seed for a cryptographic hash when PYTHONHASHSEED is unset


def _engine_hash(algo: str) -> Any:
    """Return vLLM's hash function of that name, stated in kvspec's words: SHA-256 or xxHash3-128 over the pickle
    (highest protocol) or canonical CBOR of the value; SpecError naming the package when one is missing."""

    if algo.endswith("_cbor"):
        try:
            import cbor2
        except ImportError:
            raise SpecError(RULE_HASH, f"--hash-algo {algo} needs cbor2: pip install cbor2") from None

        def encode(x: Any) -> bytes:
            return bytes(cbor2.dumps(x, canonical=True))
    else:
        def encode(x: Any) -> bytes:
            return pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)
    if algo.startswith("sha256"):
        return lambda x: hashlib.sha256(encode(x)).digest()
    try:
        import xxhash
    except ImportError:
        raise SpecError(RULE_HASH, f"--hash-algo {algo} needs xxhash: pip install xxhash") from None
    return lambda x: xxhash.xxh3_128_digest(encode(x))


def compute_engine_chain(tokens: Sequence[int], unit: int, algo: str = "sha256", seed: str | None = None,
                         cache_salt: str | None = None, lookahead: int = 0) -> tuple[bytes, ...]:
    """Return the block hashes an engine keys a request by, one per full unit: kvspec's chain (algo "kvspec"), or
    vLLM's: the root is hash(seed); unit k hashes (parent, its token ids as a tuple, extra keys), the extra keys
    being None, or (("cache_salt", salt),) on the first unit; with λ > 0 they become (those keys, the λ tokens
    after the unit…) and only units whose λ following tokens exist are hashed."""
    require(algo in HASH_ALGOS, RULE_HASH, f"unknown hash algorithm {algo!r} (known: {', '.join(HASH_ALGOS)})")
    if algo == "kvspec":
        return compute_lookahead_chain(tokens, unit, lookahead, extra_keys=(cache_salt,) if cache_salt else ())
    if algo.startswith("xxhash") and seed is None:
        raise SpecError(RULE_HASH, f"{algo} roots its chain in a random seed unless PYTHONHASHSEED is set: give the "
                                   "deployment's PYTHONHASHSEED as --hash-seed")
    h = _engine_hash(algo)
    parent = h(seed if seed is not None else VLLM_DEFAULT_SEED)
    out: list[bytes] = []
    for k in range((len(tokens) - lookahead) // unit if len(tokens) >= lookahead else 0):
        extra: Any = (("cache_salt", cache_salt),) if k == 0 and cache_salt else None
        end = (k + 1) * unit
        if lookahead == 1:
            extra = (extra, tokens[end])
        elif lookahead > 1:
            extra = (extra, *tokens[end:end + lookahead])
        parent = h((parent, tuple(tokens[k * unit:end]), extra))
        out.append(parent)
    return tuple(out)


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
                       tokens: Sequence[int] | None = None, rules: str = VLLM_0_33, hash_algo: str | None = None,
                       hash_seed: str | None = None, cache_salt: str | None = None) -> dict[str, Any]:
    """Return the report of a key dump: objects with the ranks holding and lacking them, bad lines, whether the
    dump fits the geometry, and (given the token ids) boundaries and the spec's outcome on the objects every rank
    holds. The hashes are mapped with the engine's chain (`hash_algo`; default: the grammar's engine)."""
    require(grammar in GRAMMARS, "key-grammar", f"unknown grammar {grammar!r} (known: {', '.join(GRAMMARS)})")
    d = geometry.parallel.dcp
    holders: dict[tuple[str, str, int, int, str], set[int]] = defaultdict(set)
    bad: list[dict[str, Any]] = []
    seen_ranks: set[int] = set()
    seen_groups: set[int] = set()
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
        seen_ranks.add(k.dcp_rank)
        seen_groups.add(k.group)
        if k.dcp_rank >= d or k.group >= len(geometry.groups):
            bad.append({"line": lineno, "rule": "key-range",
                        "message": f"dcp_rank {k.dcp_rank} / group {k.group} outside this geometry (D={d}, "
                                   f"{len(geometry.groups)} groups)"})
            continue
        holders[(k.cache_prefix, k.model, k.pp_rank, k.group, k.hash_hex)].add(k.dcp_rank)
    boundary_of: dict[str, int] = {}
    algo = hash_algo or ("kvspec" if grammar == "kvspec" else "sha256")
    if tokens is not None:
        chain = compute_engine_chain(tokens, geometry.unit, algo, hash_seed, cache_salt,
                                     compute_lookahead(get_rules(rules), geometry))
        boundary_of = {h.hex(): (i + 1) * geometry.unit for i, h in enumerate(chain)}
    objects: list[dict[str, Any]] = []
    for (prefix, model, pp, group, h), ranks in sorted(holders.items(), key=lambda x: (x[0][3], boundary_of.get(x[0][4], 0),
                                                                                        x[0][4])):
        missing = sorted(set(range(d)) - ranks)
        objects.append({"cache_prefix": prefix, "model": model, "pp_rank": pp, "group": group, "hash_hex": h,
                        "boundary": boundary_of.get(h), "ranks": sorted(ranks), "missing_ranks": missing,
                        "in_present_set": not missing})
    report: dict[str, Any] = {"keys": n, "bad_lines": bad, "objects": objects,
                              "complete_objects": sum(o["in_present_set"] for o in objects),
                              "warnings": _fit_warnings(geometry, seen_ranks, seen_groups)}
    if tokens is not None:
        present = {(GroupId(o["group"]), Boundary(o["boundary"])) for o in objects
                   if o["in_present_set"] and o["boundary"] is not None}
        unmatched = sum(o["boundary"] is None for o in objects)
        report["unmatched_hashes"] = unmatched
        report["hash"] = {"algo": algo, "seed": hash_seed, "cache_salt": cache_salt}
        if objects and unmatched == len(objects):
            report["warnings"].append(
                f"none of the {len(objects)} objects' hashes is a boundary of these {len(tokens)} tokens under hash "
                f"{algo} (seed {hash_seed or 'default'}, cache salt {cache_salt or 'none'}, λ from {rules}): wrong "
                "token ids, hash algorithm (--hash-algo), PYTHONHASHSEED (--hash-seed) or cache salt (--cache-salt)?")
        elif unmatched:
            report["warnings"].append(f"{unmatched} of {len(objects)} objects' hashes are not boundaries of these "
                                      "tokens (other requests' prefixes; left out of E)")
        if tokens:
            top = len(tokens) // geometry.unit * geometry.unit
            sc = Scenario(geometry=geometry, prompt=len(tokens), objects=frozenset(x for x in present if x[1] <= top),
                          rules=rules)
            out = encode_outcome(sc, evaluate_scenario(sc))
            out.pop("input")
            report["outcome"] = out
    return report


def _fit_warnings(geometry: Geometry, ranks: set[int], groups: set[int]) -> list[str]:
    """Return what in a dump's rank and group fields does not fit the geometry (another deployment's dump?)."""
    out = []
    d, ng = geometry.parallel.dcp, len(geometry.groups)
    if ranks and max(ranks) >= d:
        out.append(f"the dump has keys of DCP ranks up to {max(ranks)}, this geometry only 0..{d - 1}: a dump of a "
                   f"DCP {max(ranks) + 1}+ deployment? (--dcp)")
    elif ranks and len(ranks) < d:
        out.append(f"the dump has keys of DCP ranks {sorted(ranks)} only, this geometry {d} ranks: every object "
                   f"lacks ranks {sorted(set(range(d)) - ranks)[:8]} (a DCP {max(ranks) + 1} deployment, or those "
                   "ranks' stores were lost?)")
    if groups and max(groups) >= ng:
        out.append(f"the dump has keys of groups up to {max(groups)}, this geometry {ng} groups (--group)")
    return out


def format_key_report(report: dict[str, Any]) -> str:
    """Return the readable report of `kvspec keys check`."""
    lines = [f"{report['keys']} keys, {len(report['objects'])} objects, {report['complete_objects']} held by every "
             f"rank (in E), {len(report['bad_lines'])} lines that are not keys"]
    lines += [f"WARNING: {w}" for w in report.get("warnings", [])]
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
