"""The `kvspec` command line: explain (the spec on one scenario), verify (the proofs), conform, bench.

User mistakes exit 2 with one line naming the violated rule; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn

import attrs

from kvspec import __version__
from kvspec.checks.cli.budget import limit_cpu
from kvspec.spec.boundaries import EMPTY, Objects, compute_at_most, find_max
from kvspec.spec.errors import SpecError, require
from kvspec.spec.geometry import (
    Geometry,
    Group,
    Parallel,
    compute_rank_fields,
    compute_ranks,
    compute_span,
    resolve_kind,
)
from kvspec.spec.keys import GRAMMAR_KVSPEC, KEY_GRAMMARS, StoreKey, parse_key, render_key
from kvspec.spec.limits import MAX_EVICTED, MAX_SHARDS, RULE_LIMIT_EVICTED, RULE_LIMIT_SHARDS, check_count
from kvspec.spec.presets import PRESETS, get_preset
from kvspec.spec.rules import (
    DEFAULT_RULES,
    LEGACY_SWITCH_RULES,
    RULE_SETS,
    STORE_VLLM_0_33,
    compute_lookahead,
    compute_rule_geometry,
    get_rules,
)
from kvspec.spec.scenario import (
    Outcome,
    Scenario,
    StoredRequest,
    compute_hit,
    compute_stored_objects,
    compute_writer_lookahead,
    decode_objects,
    decode_scenario,
    encode_error,
    encode_outcome,
    evaluate_scenario,
)
from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule, compute_checkpoints, compute_mamba_states, describe_schedule
from kvspec.spec.store import RankObj, compute_checkpoint
from kvspec.spec.types import Boundary, GroupId, Rank, Tokens


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _die("cli-usage", message)  # one line (the contract of every error); bare `kvspec` also prints the usage


_JSON_ERRORS = [False]  # set by `--json`: errors also go to stdout as one JSON object


def _die(rule: str, message: str, usage: str | None = None) -> NoReturn:
    if _JSON_ERRORS[0]:
        print(json.dumps({"error": {"rule": rule, "message": message}}))
    print(f"kvspec: error: {rule}: {message}", file=sys.stderr)
    if usage and not _JSON_ERRORS[0]:
        print(usage.rstrip(), file=sys.stderr)
    raise SystemExit(2)


def _parse_group(text: str) -> Group:
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "eagle"):
        raise SpecError("group-syntax", f"--group takes KIND:BLOCK[:eagle], got {text!r}")
    try:
        block = int(parts[1])
    except ValueError:
        raise SpecError("group-syntax", f"block size of --group {text!r} is not an integer") from None
    return Group(kind=resolve_kind(parts[0]), block_size=block, eagle=len(parts) == 3)


DRAFTERS = {"eagle": 1, "eagle3": 1, "mtp": 1, "mtp-multi": None, "dspark": 0, "dflash": 0, "none": 0}


def _apply_drafter(args: argparse.Namespace, g: Geometry) -> Geometry:
    """Return the geometry with --drafter's reach: EAGLE, EAGLE3, MTP read 1 token past a position, multi-module MTP
    (mtp-multi:K) K; each needs the EAGLE-flagged group it shortens. DSpark, DFlash and none take neither the drop nor
    lookahead (vLLM's needs_eagle_block_drop excludes them): no group may carry the flag."""
    text = getattr(args, "drafter", None)
    if text is None:
        return g
    name, _, k = text.partition(":")
    if name not in DRAFTERS or (name == "mtp-multi") != bool(k):
        raise SpecError("cli-usage", f"--drafter takes {', '.join(n for n in DRAFTERS if n != 'mtp-multi')} or "
                                     f"mtp-multi:K, got {text!r}")
    reach = DRAFTERS[name] if name != "mtp-multi" else _ints(k, "--drafter mtp-multi", "K", (1,))[0]
    eagle = any(gr.eagle for gr in g.groups)
    if reach and not eagle:
        raise SpecError("draft-reach", f"--drafter {text} drafts with the EAGLE drop: flag the group it shortens "
                                       f"(--group KIND:BLOCK:eagle)")
    if not reach and eagle:
        raise SpecError("draft-reach", f"--drafter {text} takes neither the EAGLE drop nor lookahead hashes: drop the "
                                       f":eagle flag (its draft KV group is a plain attention group)")
    return attrs.evolve(g, draft_reach=max(1, reach or 1))


def _geometry(args: argparse.Namespace) -> Geometry:
    return _apply_drafter(args, _geometry_of_flags(args))


def _geometry_of_flags(args: argparse.Namespace) -> Geometry:
    if getattr(args, "from_vllm", None):
        return _geometry_from_vllm(args)
    interleave, pcp = args.interleave, args.pcp
    if args.preset:
        base = get_preset(args.preset)
        groups = tuple(_parse_group(g) for g in args.group) if args.group else base.groups
        return Geometry(unit=args.unit if args.unit is not None else base.unit, groups=groups,
                        parallel=Parallel(dcp=args.dcp if args.dcp is not None else base.parallel.dcp,
                                          interleave=interleave if interleave is not None else base.parallel.interleave,
                                          pcp=pcp if pcp is not None else base.parallel.pcp),
                        retention=args.retention or base.retention)
    if not args.group:
        raise SpecError("groups-nonempty", "give --preset or at least one --group KIND:BLOCK[:eagle]")
    return Geometry(unit=args.unit if args.unit is not None else 1, groups=tuple(_parse_group(g) for g in args.group),
                    parallel=Parallel(dcp=args.dcp if args.dcp is not None else 1, interleave=interleave or 1,
                                      pcp=pcp or 1),
                    retention=args.retention or "replay")


def _geometry_from_vllm(args: argparse.Namespace) -> Geometry:
    """Return the geometry of --from-vllm FILE (groups from the file or --group KIND; no other geometry flag)."""
    from kvspec.checks.conform.vllm_config import compute_geometry_from_vllm, parse_group_kind
    clash = [f"--{n.replace('_', '-')}" for n in ("preset", "unit", "dcp", "retention", "interleave", "pcp")
             if getattr(args, n) is not None]
    if clash:
        raise SpecError("cli-usage", f"--from-vllm gives the whole geometry; drop {', '.join(clash)} (or edit the file)")
    mapped = compute_geometry_from_vllm(_read_json(args.from_vllm), tuple(parse_group_kind(g) for g in args.group))
    args.vllm_provenance = mapped.provenance
    return mapped.geometry


def _ints(text: str, flag: str, shape: str, n: tuple[int, ...]) -> list[int]:
    parts = text.split(":")
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        raise SpecError("cli-usage", f"{flag} takes {shape}, got {text!r}") from None
    if len(vals) not in n:
        raise SpecError("cli-usage", f"{flag} takes {shape}, got {text!r}")
    return vals


STORED_SHAPE = "P[+O][:S[:RULES]]"


def _requests(args: argparse.Namespace) -> tuple[StoredRequest, ...]:
    """Return the --stored P[+O][:S[:RULES]] requests (O: tokens the writer decoded before it finished; S defaults to
    min(P, N); RULES: the writer's rule set, when not the reader's --rules)."""
    out = []
    for text in args.stored:
        parts = text.split(":")
        writer = parts.pop().strip() if len(parts) > 1 and not parts[-1].strip().lstrip("-").isdigit() else ""
        if writer and writer not in RULE_SETS:
            raise SpecError("cli-usage", f"--stored takes {STORED_SHAPE}, got {text!r}: {writer!r} is not a rule set "
                                         f"(known: {', '.join(RULE_SETS)})")
        head, plus, decoded = parts[0].partition("+")
        v = _ints(":".join([head, *parts[1:]]), "--stored", STORED_SHAPE, (1, 2))
        o = _ints(decoded, "--stored", STORED_SHAPE, (1,))[0] if plus else 0
        out.append(StoredRequest(prompt=v[0], shared=v[1] if len(v) == 2 else min(v[0], args.prompt),
                                 rules=get_rules(writer).name if writer else None, decoded=o,
                                 save_decode_cache=args.save_decode_cache))
    return tuple(out)


def _evictions(args: argparse.Namespace, geometry: Geometry) -> frozenset[RankObj]:
    """Return the --evict GROUP:BOUNDARY[:RANK] shards (no RANK: on every rank)."""
    out: set[RankObj] = set()
    parsed = [_ints(text, "--evict", "GROUP:BOUNDARY[:RANK]", (2, 3)) for text in args.evict]
    # counted before they are listed (10^4 evictions from every rank of D = 64 would be 640,000 shards)
    check_count(sum(1 if len(v) == 3 else geometry.parallel.dcp for v in parsed), MAX_EVICTED, RULE_LIMIT_EVICTED,
                "evicted shard count")
    for v in parsed:
        ranks = [v[2]] if len(v) == 3 else range(geometry.parallel.dcp)
        out.update((GroupId(v[0]), Boundary(v[1]), Rank(r)) for r in ranks)
    return frozenset(out)


MAX_INPUT_BYTES = 16 << 20  # a --stored-json file or one --scenarios line; larger input is refused, not read


def _parse_json(data: bytes, what: str, rule: str) -> Any:
    """Return the JSON value of bytes, or raise SpecError naming the rule (size, UTF-8, syntax, nesting)."""
    if len(data) > MAX_INPUT_BYTES:
        raise SpecError("input-size", f"{what} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError("input-encoding", f"{what} is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(rule, f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise SpecError("input-depth", f"{what} nests JSON too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise SpecError(rule, f"{what}: {exc}") from None


def _read_bounded(path: str) -> bytes:
    """Return at most MAX_INPUT_BYTES + 1 bytes of a file (- for stdin); the callers refuse the larger ones."""
    try:
        with (sys.stdin.buffer if path == "-" else open(path, "rb")) as f:
            return f.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise SpecError("input-file", f"cannot read {path}: {exc.strerror or exc}") from None


def _read_json(path: str) -> Any:
    return _parse_json(_read_bounded(path), path, "stored-json")


def _scenario(args: argparse.Namespace) -> Scenario:
    geometry = _geometry(args)
    if args.prompt is None:
        raise SpecError("scenario", "--prompt N (the lookup request's length) is required")
    rule = get_rules(LEGACY_SWITCH_RULES if args.legacy_tail_key else (args.rules or DEFAULT_RULES)).name
    evicted = _evictions(args, geometry)
    schedule = _schedule(args)
    if args.decoded is not None and args.stored_prompt is None:
        raise SpecError("scenario", "--decoded O applies to --stored-prompt (with --stored write P+O:S)")
    if args.save_decode_cache and args.stored_json is not None:
        raise SpecError("scenario", "--save-decode-cache applies to stored requests, not to --stored-json objects")
    if args.stored_json is not None:
        if args.stored_prompt is not None or args.shared is not None or args.stored:
            raise SpecError("scenario", "--stored-json excludes --stored-prompt, --stored and --shared")
        return Scenario(geometry=geometry, prompt=args.prompt, objects=decode_objects(_read_json(args.stored_json)),
                        evicted=evicted, rules=rule, schedule=schedule)
    if args.stored:
        if args.stored_prompt is not None or args.shared is not None:
            raise SpecError("scenario", "--stored P[:S] excludes --stored-prompt and --shared")
        return Scenario(geometry=geometry, prompt=args.prompt, stored=_requests(args), evicted=evicted, rules=rule,
                        schedule=schedule)
    if args.stored_prompt is None:
        raise SpecError("scenario", "give --stored-prompt P, --stored P[:S] or --stored-json FILE")
    shared = args.shared if args.shared is not None else min(args.stored_prompt, args.prompt)
    return Scenario(geometry=geometry, prompt=args.prompt,
                    stored=(StoredRequest(prompt=args.stored_prompt, shared=shared, decoded=args.decoded or 0,
                                          save_decode_cache=args.save_decode_cache),),
                    evicted=evicted, rules=rule, schedule=schedule)


def _schedule(args: argparse.Namespace) -> Schedule:
    """Return the --chunk-budget / --no-chunked-prefill / --checkpoint-alignment / --long-prefill-threshold schedule."""
    if args.chunk_budget is None and (args.no_chunked_prefill or args.checkpoint_alignment is not None
                                      or args.long_prefill_threshold or args.stop_every):
        raise SpecError("schedule", "--no-chunked-prefill, --checkpoint-alignment, --long-prefill-threshold and "
                                    "--stop-every describe a scheduler with a token budget: give --chunk-budget B too")
    return Schedule(budget=args.chunk_budget, chunked=not args.no_chunked_prefill,
                    checkpoint_alignment=args.checkpoint_alignment,
                    long_prefill_threshold=args.long_prefill_threshold or 0, stop_every=args.stop_every or 0)


def compute_why(scenario: Scenario, outcome: Outcome) -> str | None:
    """Return why the hit is what it is when a group caps it below the bound it was offered (None otherwise)."""
    look = outcome.lookup
    if look is None:
        return None
    capping = [s for s in look.steps if s.action == "find" and s.result < s.bound]
    if not capping:
        return None
    s = capping[-1] if outcome.hit_length > 0 else next(x for x in capping if x.result == 0)
    g = scenario.geometry
    kind = g.groups[s.members[0]].kind
    have = _present_up_to(outcome, s.members, s.search_bound)
    lost = sorted({(gid, t) for gid, t, _ in scenario.evicted if gid in s.members and s.result < t <= s.search_bound})
    dropped_only = s.eagle_drop and s.result + g.unit >= s.bound  # the chain reached the bound; the drop cut it
    if dropped_only:
        what = (f"the EAGLE drop: its blocks reach {s.bound}, but the drafter must recompute the last unit "
                f"({g.unit} tokens) to read the token after the hit")
    else:
        what = ("no block boundary chain reaches past it" if kind == "attention" else
                "no Mamba state is present on every rank at a boundary above it")
    shown = (f"{have}" if len(have) <= 4 else f"the last 4 of {len(have)}: {have[-4:]}") if have else "none"
    line = (f"why: hit {outcome.hit_length}: spec group {list(s.members)} ({kind}) accepts only {s.result} of the "
            f"{s.bound} it was offered: {what} (present at or below {s.search_bound}: {shown}")
    if s.eagle_drop and not dropped_only and s.result > 0:
        line += "; the EAGLE drop then takes one unit off its reach"
    if lost:
        line += f"; evicted there: {[t for _, t in lost]}"
    return line + ")"


def _present_up_to(outcome: Outcome, members: Sequence[int], bound: int, keep: int = 4) -> list[int]:
    """Return the boundaries present for some member at or below the bound (only the last `keep`, above the first
    ones, when E is runs: listing them would grow with the prompt)."""
    if not isinstance(outcome.present, Objects):
        return sorted(t for gid, t in outcome.present if gid in members and t <= bound)
    out: set[int] = set()
    for m in members:
        b = compute_at_most(outcome.present.by_group.get(GroupId(m), EMPTY), bound)
        top: int | None = bound + 1
        for _ in range(keep):
            top = find_max(b, 0, top - 1) if top is not None else None
            if top is None:
                break
            out.add(top)
    return sorted(out)[-keep:]


def format_ranks(scenario: Scenario, outcome: Outcome, model: str = "kvspec-model") -> str:
    """Return the per-rank view of the load plan: which token slots each rank's block holds (the DCP ownership
    rule, honouring interleave), the key it loads under, and whether that rank's key is present."""
    g = scenario.geometry
    held = compute_stored_objects(scenario) - scenario.evicted
    d, il = g.parallel.dcp, g.parallel.interleave
    out = [f"per rank (H_t is the chain hash of the first t tokens; keys in kvspec's grammar, model {model!r}):"]
    if not outcome.load:
        out.append("  (nothing to load)")
    for r in compute_ranks(g) if outcome.load else ():
        out.append(f"  rank {r}:")
        for e in outcome.load:
            gr = g.groups[e.group]
            s = compute_span(g, GroupId(e.group))
            if gr.kind == "attention":
                lo = e.block * s
                what = (f"slots hold runs of {il} token(s) from {lo + r * il}, every {d * il}, within [{lo}, {lo + s}) "
                        f"({gr.block_size} slots; [{e.start}, {e.end}) counts)")
            else:
                what = f"the whole state after {e.key_boundary} tokens (every rank keeps its own copy)"
            fields = compute_rank_fields(g, r)
            key = render_key(StoreKey(model=model, tp_rank=fields.tp_rank, pcp_rank=fields.pcp_rank,
                                      dcp_rank=fields.dcp_rank, pp_rank=fields.pp_rank, group=e.group,
                                      hash_hex="0" * 64)).rsplit("@", 1)[0] + f"@H_{e.key_boundary}"
            there = "present" if (e.group, e.key_boundary, r) in held else "MISSING on this rank (-704)"
            out.append(f"    group {e.group} block {e.block}: {what}; key {key}: {there}")
    return "\n".join(out)


RELEASE_BUDGET = 8192  # vLLM's max_num_batched_tokens for `vllm serve` on H100/H200 (EngineArgs.get_batch_defaults)


def _short(xs: Sequence[int], keep: int = 6) -> str:
    return str(list(xs)) if len(xs) <= keep else f"[{', '.join(map(str, xs[:2]))}, ... {len(xs) - 4} more ..., " \
                                                 f"{', '.join(map(str, xs[-2:]))}]"


def format_schedule(scenario: Scenario) -> list[str]:
    """Return the schedule lines of a scenario whose rule set reads one: per stored request its chunk ends and the
    Mamba states they leave; under the block schedule also what vLLM serve's default budget would leave and hit."""
    rules = scenario.rules
    g = scenario.geometry
    mamba = [i for i, gr in enumerate(g.groups) if gr.kind == "mamba"]
    if rules.store != STORE_VLLM_0_33 or not mamba or scenario.objects is not None or not scenario.stored:
        return []
    rg, lam = compute_rule_geometry(rules, g), compute_lookahead(rules, g)
    if scenario.schedule == BLOCK_SCHEDULE and all(r.schedule is None for r in scenario.stored):
        # every block end has a state: one line, and what vLLM's default changes
        line = f"schedule: {describe_schedule(scenario.schedule)}"
        try:
            h = compute_hit(attrs.evolve(scenario, schedule=Schedule(budget=RELEASE_BUDGET)))
        except SpecError:
            return [line]
        here = compute_hit(scenario)
        return [f"{line}; under vLLM serve's default budget (--chunk-budget {RELEASE_BUDGET}, H100/H200) the hit "
                f"is {h}" + (" too" if h == here else f", not {here}: fewer Mamba states exist there")]
    own_ones = any(r.schedule is not None for r in scenario.stored)
    out = [f"schedule: {describe_schedule(scenario.schedule)}" + ("; a request's own schedule in brackets" if own_ones
                                                                 else "")]
    for r in scenario.stored:
        try:
            cps = compute_checkpoints(r.schedule or scenario.schedule, rg, Tokens(r.prompt), lam)
        except SpecError as err:
            out.append(f"  stored prompt {r.prompt}: {err.rule}: {err.message}")
            continue
        c = compute_checkpoint(rg, Tokens(r.prompt), lam)
        states = {i: sorted(compute_mamba_states(cps, g.groups[i].block_size, c)) for i in mamba}
        own = f" ({describe_schedule(r.schedule)})" if r.schedule is not None else ""
        inside = f" (checkpoint blocks exported {list(cps.internals)})" if cps.internals else ""
        shown = "; ".join(f"group {i} {_short(v)}" for i, v in states.items())
        out.append(f"  stored prompt {r.prompt}{own}: chunks end at {_short(cps.ends)}{inside}; Mamba states exist at: "
                   f"{shown}")
    return out


def format_lookup(scenario: Scenario, outcome: Outcome, d: dict[str, Any]) -> list[str]:
    """Return the lines from the schedule to the load plan's heading: the lookup's trace, h, why, tails."""
    out = format_schedule(scenario)
    out.append(f"lookup: N={scenario.prompt}")
    for st in outcome.lookup.steps if outcome.lookup is not None else ():
        what = (f"find  bound {st.bound}" + (f" peek {st.search_bound}" if st.search_bound != st.bound else "")
                + (" eagle-drop" if st.eagle_drop else "")) if st.action == "find" else f"cap   at {st.bound}"
        rnd = " (N-1 re-derivation)" if st.round else ""
        out.append(f"  pass {st.pass_no}{rnd}: spec group {st.spec_group} {list(st.members)}: {what} -> {st.result}")
    out.append(f"hit length: {d['hit_length']}")
    why = compute_why(scenario, outcome)
    if why:
        out.append(why)
    if d["error"]:
        out.append(f"error: {d['error']['rule']}: {d['error']['message']}")
    out.append("tail boundaries: " + (", ".join(f"group {t['group']} @ {t['boundary']}" for t in d["tail_boundaries"])
                                      or "none (h = 0)"))
    out.append("load plan (whole physical blocks; only [0, h) counts as computed):")
    return out


def _format_reach(scenario: Scenario) -> str:
    """Return ' drafter reach K (λ = …)' when the drafter reads more than one token ahead (multi-module MTP)."""
    g = scenario.geometry
    if g.draft_reach == 1:
        return ""
    return f"  drafter reach {g.draft_reach} (λ = {compute_lookahead(scenario.rules, g)})"


def format_fleet(scenario: Scenario) -> list[str]:
    """Return a line per stored request whose writer ran another rule set (a mixed fleet): its λ, and whether the
    reader can name its objects."""
    g, out = scenario.geometry, []
    for k, r in enumerate(scenario.stored):
        if r.rules is not None and r.rules != scenario.rules:
            lw = compute_lookahead(r.rules, g)
            seen = compute_writer_lookahead(g, scenario.rules, r) is not None
            out.append(f"stored request {k} ({r.prompt} tokens) written under {r.rules} (λ = {lw}): "
                       + ("its keys are the reader's" if seen else
                          f"the reader hashes with λ = {compute_lookahead(scenario.rules, g)}: "
                          "none of its keys is one the reader names (a miss, never its bytes)"))
    return out


def format_table(scenario: Scenario, outcome: Outcome) -> str:
    """Return the readable explanation of one scenario."""
    d = encode_outcome(scenario, outcome)
    if d.get("form") == "compact":
        return format_compact_table(scenario, outcome, d)
    geo = d["geometry"]
    out = [f"geometry: D={geo['dcp']} u={geo['unit']} L={geo['lcm_span']} fine={geo['fine']} "
           f"a={geo['alignment']} retention={geo['retention']}  rules: {scenario.rules}{_format_reach(scenario)}"]
    out.extend(format_fleet(scenario))
    out.append("  group  kind       block  span   eagle  stored boundaries (present in E)")
    for g in geo["groups"]:
        ts = [o["boundary"] for o in d["stored"] if o["group"] == g["id"]]
        out.append(f"  {g['id']:<5}  {g['kind']:<9}  {g['block_size']:<5}  {g['span']:<5}  "
                   f"{'yes' if g['eagle'] else 'no':<5}  {ts if ts else '-'}")
    out.extend(format_lookup(scenario, outcome, d))
    out.append("  group  block  tokens            key boundary  present")
    for e in d["load"]:
        span = f"[{e['start']}, {e['end']})"
        out.append(f"  {e['group']:<5}  {e['block']:<5}  {span:<16}  "
                   f"{e['key_boundary']:<12}  {'yes' if e['present'] else 'NO (-704 at load)'}")
    if not d["load"]:
        out.append("  (nothing to load)")
    return "\n".join(out)


def _format_runs(entry: dict[str, Any]) -> str:
    """Return one group's compact E: 'k·s for s ≤ k·s ≤ last' per run, then its points, less its evicted members."""
    parts = [f"every {step} from {first} to {last} ({(last - first) // step + 1})" for first, step, last in entry["runs"]]
    if entry["points"]:
        parts.append(_short(entry["points"]))
    out = " + ".join(parts) or "-"
    return out + (f", less evicted {_short(entry['evicted'])}" if entry["evicted"] else "")


def format_compact_table(scenario: Scenario, outcome: Outcome, d: dict[str, Any]) -> str:
    """Return the readable explanation of a scenario past the explicit limit: E and the plan as runs."""
    geo = d["geometry"]
    out = [f"geometry: D={geo['dcp']} u={geo['unit']} L={geo['lcm_span']} fine={geo['fine']} "
           f"a={geo['alignment']} retention={geo['retention']}  rules: {scenario.rules}{_format_reach(scenario)}",
           f"past the explicit limit ({MAX_SHARDS} rank shards): E and the load plan as runs (--explicit lists them)"]
    out.extend(format_fleet(scenario))
    out.append("  group  kind       block  span   eagle  stored boundaries (present in E)")
    runs = {e["group"]: e for e in d["stored"]}
    for g in geo["groups"]:
        shown = _format_runs(runs[g["id"]]) if g["id"] in runs else "-"
        out.append(f"  {g['id']:<5}  {g['kind']:<9}  {g['block_size']:<5}  {g['span']:<5}  "
                   f"{'yes' if g['eagle'] else 'no':<5}  {shown}")
    out.extend(format_lookup(scenario, outcome, d))
    for r in d["load"]:
        s, first, last = r["span"], r["first_block"], r["last_block"]
        blocks = (f"blocks {first}..{last}: [{first * s}, {d['hit_length']}), each keyed at its block end, block "
                  f"{last} at {r['tail_key']}") if last > first else \
            f"block {last}: [{last * s}, {d['hit_length']}) keyed at {r['tail_key']}"
        missing = (f"NOT present (-704 at load): blocks {_short(r['absent_blocks'])}" if r["absent_blocks"]
                   else "all present")
        out.append(f"  group {r['group']} {blocks}; {missing}")
    if not d["load"]:
        out.append("  (nothing to load)")
    return "\n".join(out)


def _run_scenarios(path: str, check: bool = False, explicit: bool = False) -> int:
    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115 - closed by `with` below
    except OSError as exc:
        _die("input-file", f"cannot read {path}: {exc.strerror or exc}")
    write = sys.stdout.write
    failed = False
    with stream:
        lineno = 0
        while True:
            line = stream.readline(MAX_INPUT_BYTES + 1)
            if not line:
                break
            lineno += 1
            if len(line) > MAX_INPUT_BYTES:  # the rest of the file is not read: one error object, then stop
                err = SpecError("input-size", f"line {lineno} is longer than {MAX_INPUT_BYTES} bytes; the rest "
                                              f"of {path} is not read")
                write(json.dumps(encode_error(err)) + "\n")
                _die(err.rule, err.message)
            if not line.strip():
                continue
            try:
                with limit_cpu(f"line {lineno}"):
                    sc = decode_scenario(_parse_json(line, f"line {lineno}", "scenario-json"))
                    result = _encode(sc, evaluate_scenario(sc), explicit)
            except SpecError as err:
                result = encode_error(err)
            except RecursionError:
                result = encode_error(SpecError("input-depth", f"line {lineno} nests too deeply"))
            failed = failed or _fails_check(result)
            write(json.dumps(result, separators=(",", ":")) + "\n")
    return 1 if check and failed else 0


MAX_LISTING = 1 << 20  # objects and planned blocks --explicit lists past the explicit limit


def _encode(scenario: Scenario, outcome: Outcome, explicit: bool) -> dict[str, Any]:
    """Return encode_outcome's object; --explicit past the explicit limit lists at most MAX_LISTING items."""
    if explicit and outcome.load_runs is not None:
        n = len(outcome.present) + sum(r.last - r.first + 1 for r in outcome.load_runs)
        require(n <= MAX_LISTING, "limit-listing", f"--explicit would list {n} objects and blocks, past {MAX_LISTING} "
                                                   f"(checks/cli/main.py): drop --explicit for the compact form (runs)")
    return encode_outcome(scenario, outcome, explicit)


def _fails_check(result: dict[str, Any]) -> bool:
    """Return whether a result fails --check: an error, or a planned load key that is not present."""
    return result["error"] is not None or any(not e.get("present", True) or e.get("absent_blocks")
                                              for e in result["load"])


_SCENARIO_FLAGS = ("preset", "dcp", "unit", "group", "retention", "interleave", "pcp", "drafter", "stored_prompt", "stored",
                   "evict", "prompt", "shared", "decoded", "save_decode_cache", "stored_json", "rules", "legacy_tail_key",
                   "from_vllm", "chunk_budget", "no_chunked_prefill", "checkpoint_alignment", "long_prefill_threshold",
                   "stop_every")


def _explain(args: argparse.Namespace) -> int:
    if args.scenarios is not None:
        given = [f"--{f.replace('_', '-')}" for f in (*_SCENARIO_FLAGS, "svg", "ranks")
                 if getattr(args, f) not in (None, [], False)]
        if given:  # each line says its own scenario: a flag beside --scenarios would be ignored, so refuse it
            raise SpecError("cli-usage", f"--scenarios takes its scenarios from the file and answers JSON lines; "
                                         f"drop {', '.join(given)}")
        return _run_scenarios(args.scenarios, check=args.check, explicit=args.explicit)
    if args.ranks and args.json:
        raise SpecError("cli-usage", "--ranks prints the per-rank view as text; with --json it would be ignored: "
                                     "drop one (the JSON result has the load plan; `keys check` has rank detail)")
    with limit_cpu("the scenario"):
        sc = _scenario(args)
        outcome = evaluate_scenario(sc)
        if outcome.load_runs is not None and (args.svg or args.ranks):
            raise SpecError(RULE_LIMIT_SHARDS, f"--{'svg' if args.svg else 'ranks'} draws every block of every rank, "
                                               f"and this scenario is past the explicit limit (spec/limits.py: "
                                               f"MAX_SHARDS {MAX_SHARDS} rank shards): it is answered on runs; drop "
                                               f"the flag, or look at a shorter prompt")
        result = _encode(sc, outcome, args.explicit)
        text = None if args.json else format_table(sc, outcome)
    provenance = getattr(args, "vllm_provenance", None)
    if provenance is not None:
        result["from_vllm"] = {"file": args.from_vllm, "mapping": [{"field": f, "from": src} for f, src in provenance]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        if provenance is not None:
            from kvspec.checks.conform.vllm_config import format_provenance
            print(f"geometry from the vLLM configuration {args.from_vllm}:")
            print(format_provenance(provenance))
        print(text)
        if args.ranks:
            print(format_ranks(sc, outcome))
    if args.svg:
        from kvspec.checks.cli.picture import render_svg
        from kvspec.checks.output import write_output_file
        write_output_file(args.svg, render_svg(sc, outcome))
    return 1 if args.check and _fails_check(result) else 0


def _read_lines(path: str) -> list[str]:
    data = _read_bounded(path)
    if len(data) > MAX_INPUT_BYTES:
        raise SpecError("input-size", f"{path} is larger than {MAX_INPUT_BYTES} bytes")
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SpecError("input-encoding", f"{path} is not UTF-8: {exc.reason} at byte {exc.start}") from None


def _keys(args: argparse.Namespace) -> int:
    from kvspec.checks.cli.keys_tool import compute_key_report, format_key_report, parse_key_vllm
    if args.keys_cmd == "parse":
        if args.grammar == "kvspec":
            k, splits = parse_key(args.key), None
        else:
            k, splits = parse_key_vllm(args.key)
        fields = {"cache_prefix": k.cache_prefix, "model": k.model, "tp_rank": k.tp_rank, "pcp_rank": k.pcp_rank,
                  "dcp_rank": k.dcp_rank, "pp_rank": k.pp_rank, "group": k.group, "hash_hex": k.hash_hex}
        if splits is not None and len(splits) > 1:
            fields["ambiguous_prefix_model"] = [{"cache_prefix": p, "model": m} for p, m in splits]
        print(json.dumps(fields, indent=2) if args.json else "\n".join(f"{n}: {v}" for n, v in fields.items()))
        return 0
    geometry = _geometry(args)
    tokens = None
    if args.tokens is not None:
        raw = _read_json(args.tokens)
        require(isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw), "tokens",
                "--tokens takes a JSON list of integer token ids")
        tokens = raw
    if tokens is None:
        _refuse_flags(args, "keys check without --tokens (no hash is mapped)", ("hash_algo", "hash_seed", "cache_salt"))
    report = compute_key_report(geometry, _read_lines(args.keys), args.grammar, tokens, args.rules, args.hash_algo,
                                args.hash_seed, args.cache_salt)
    print(json.dumps(report, indent=2) if args.json else format_key_report(report))
    return 0


def _refuse_flags(args: argparse.Namespace, mode: str, flags: Sequence[str]) -> None:
    """Raise SpecError(cli-usage) naming every flag of `flags` given although `mode` does not read it."""
    given = [f"--{f.replace('_', '-')}" for f in flags if getattr(args, f) not in (None, False, [])]
    if given:
        raise SpecError("cli-usage", f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to {mode}")


def _need(module: str, extra: str, what: str) -> None:
    """Exit 2 naming the pip line that installs `module` when it can't be imported."""
    try:
        importlib.import_module(module)
    except (ImportError, OSError) as exc:
        _die(f"{what.split()[1]}-deps", f"{what} needs {module.split('.')[0]} ({type(exc).__name__}: {exc}); "
                                       f"install it: pip install 'kvspec[{extra}]' (a checkout: make venv)")


def _conform(args: argparse.Namespace) -> int:
    if (args.engine is None) == (args.adapter is None):
        raise SpecError("cli-usage", "give exactly one of the engine (vllm, vllm-lifecycle, sglang) and --adapter "
                                         "MODULE:OBJECT")
    rules = args.rules or DEFAULT_RULES
    if args.engine in ("vllm", "vllm-lifecycle") and args.rules is None:  # the installed release's rule set

        from kvspec.checks.rulesets import find_oracle_rules
        try:
            version = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            version = None
        found = find_oracle_rules("vllm", version) if version else None
        if version and found is None:
            raise SpecError("conform-version", f"vLLM {version} is installed and no rule set names it as its oracle "
                                               "(checks/rulesets.py); give --rules NAME to compare one anyway")
        rules = found or rules
    if args.adapter is not None:
        _refuse_flags(args, "conform --adapter (it runs the vectors, then --examples searched scenarios)",
                      ("count", "root"))
        examples = 300 if args.examples is None else args.examples
        if not 0 <= examples <= 100_000:
            raise SpecError("conform-count", f"--examples must be within 0..100000, got {examples}")
        _need("hypothesis", "conform", "kvspec conform --adapter")
        from kvspec.checks.conform.adapters import format_adapter_report, load_adapter, run_adapter_conformance
        rep = run_adapter_conformance(load_adapter(args.adapter), rules, examples, args.seed,
                                      shrink=not args.no_shrink)
        print(json.dumps(rep, indent=2) if args.json else format_adapter_report(rep))
        return 0 if rep["ok"] else 1
    _refuse_flags(args, f"conform {args.engine} (it draws --count generated scenarios)", ("examples", "no_shrink"))
    count = 2000 if args.count is None else args.count
    if count < 0 or count > 1_000_000:
        raise SpecError("conform-count", f"--count must be within 0..1000000, got {count}")
    if args.engine == "sglang":
        return _conform_sglang(args, count)
    _refuse_flags(args, f"conform {args.engine} (--root is SGLang's wheel)", ("root",))
    try:
        from kvspec.checks.conform.vllm_oracle import load_vllm
        load_vllm()
    except Exception as exc:  # noqa: BLE001 - an import of vLLM fails in many ways; each is "not available here"
        _die("conform-deps", f"kvspec conform {args.engine} needs a vLLM release importable: make vllm-venv, then "
                             f".venv-vllm/bin/kvspec conform {args.engine} ({type(exc).__name__}: {exc})")
    if args.engine == "vllm-lifecycle":
        from kvspec.checks.conform.vllm_lifecycle import format_lifecycle_report, run_lifecycle_conformance
        rep = run_lifecycle_conformance(count, args.seed, rules=rules)
        print(json.dumps(rep, indent=2) if args.json else format_lifecycle_report(rep))
        return 0 if rep["ok"] else 1
    from kvspec.checks.conform.runner import format_report, run_conformance
    rep = run_conformance(count, args.seed, rules=rules)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0 if rep["ok"] else 1


def _conform_sglang(args: argparse.Namespace, count: int) -> int:
    from kvspec.checks.conform.sglang_oracle import RULES, format_report, run_oracle
    if args.rules not in (None, RULES):
        raise SpecError("conform-version", f"SGLang 0.5.23's code is the oracle of {RULES} only, not --rules {args.rules}")
    root = args.root or os.environ.get("KVSPEC_SGLANG_ROOT") or ".cache/sglang-0.5.23"
    try:
        import torch  # noqa: F401 - SGLang's controller code builds its collective's tensors with torch
    except ImportError as exc:
        _die("conform-deps", f"kvspec conform sglang needs torch (make venv) ({exc})")
    rep = run_oracle(root, count, args.seed)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0 if rep["ok"] else 1


def _add_geometry_args(parser: argparse.ArgumentParser) -> None:
    """Add the geometry flags (read by _geometry) to a subcommand."""
    geo = parser.add_argument_group("geometry (a preset, or --group flags; flags override the preset)")
    geo.add_argument("--preset", choices=sorted(PRESETS), help="a named geometry (spec/presets.py)")
    geo.add_argument("--group", action="append", default=[], metavar="KIND:BLOCK[:eagle]",
                     help="a KV-cache group in id order: kind attention|mamba (aliases mla; gdn, kda, linear), "
                          "per-rank block size in tokens, :eagle for the EAGLE-drop group (repeatable)")
    geo.add_argument("--drafter", metavar="KIND",
                     help="the speculative drafter: eagle, eagle3, mtp (its KV at p reads token p + 1), mtp-multi:K "
                          "(K modules: p + K; vLLM 0.34.0 hashes K tokens ahead), dspark, dflash, none (no drop, no "
                          "lookahead); default from the groups' :eagle flag")
    geo.add_argument("--unit", type=int, metavar="U", help="prefix-match unit u in tokens (default 1)")
    geo.add_argument("--dcp", type=int, metavar="D", help="decode context parallel size (default 1)")
    geo.add_argument("--retention", choices=["replay", "dense"],
                     help="Mamba states kept: replay (checkpoints) or dense (every block end); default replay")
    geo.add_argument("--interleave", type=int, metavar="I",
                     help="DCP KV interleave in tokens (runs of I tokens per rank; default 1)")
    geo.add_argument("--pcp", type=int, metavar="N", help="prefill context parallel size (default 1)")
    geo.add_argument("--from-vllm", metavar="FILE",
                     help="a vLLM 0.33.0 engine configuration as JSON (engine arguments, flat or in cache_config/"
                          "parallel_config/speculative_config/kv_transfer_config sections) mapped to the geometry; "
                          "the model's groups from its kv_cache_groups list or --group KIND[:BLOCK][:eagle]; refused "
                          "as vLLM refuses it (checks/conform/vllm_config.py)")


EXPLAIN_EPILOG = """example (vLLM PR #53324's Kimi-K3 deployment, DCP 8):
  kvspec explain --preset kimi-k3-dcp8 --stored-prompt 15000 --prompt 15000
  kvspec explain --group attention:1536:eagle --group mamba:1536 --unit 128 --dcp 8 \\
      --stored-prompt 15000 --prompt 15000 --rules pr53324 --json
exit status: 0 answered; 1 with --check and a missing load key or a failed line; 2 bad input (one line naming the rule)"""


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the kvspec command."""
    p = _Parser(prog="kvspec", description=__doc__)
    p.add_argument("--version", action="version", version=f"kvspec {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    e = sub.add_parser("explain", help="run the spec on one scenario (or a JSON-lines file of them)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXPLAIN_EPILOG,
                       description="Run the spec on one scenario: what was stored, the lookup's hit length, the "
                                   "tail boundaries and the load plan with every key's boundary. All lengths are "
                                   "in tokens.")
    _add_geometry_args(e)
    stored = e.add_argument_group("what was stored (one of)")
    ex = stored.add_mutually_exclusive_group()
    ex.add_argument("--stored-prompt", type=int, metavar="P", help="a stored request of P tokens")
    ex.add_argument("--stored-json", metavar="FILE",
                    help='the present objects as a JSON list of {"group": g, "boundary": t} (- for stdin)')
    stored.add_argument("--shared", type=int, metavar="S",
                        help="tokens the stored request shares with the lookup (default min(P, N))")
    stored.add_argument("--decoded", type=int, metavar="O",
                        help="tokens the stored request decoded before it finished (default 0: not finished); the "
                             "lookup may then share up to P + O tokens (it continues the conversation)")
    stored.add_argument("--save-decode-cache", action="store_true",
                        help="the stored requests' engine saved the decode phase too (vLLM's kv_connector_extra_config "
                             "save_decode_cache): its outputs' blocks, and under vllm-0.34.0 decode-phase Mamba states")
    stored.add_argument("--stored", action="append", default=[], metavar=STORED_SHAPE,
                        help="a stored request of P tokens sharing its first S with the lookup (repeatable; "
                             "S defaults to min(P, N)); +O: it decoded O tokens before it finished; RULES: the rule "
                             "set of the engine that stored it, when not the reader's (a mixed fleet, e.g. "
                             "15000:15000:vllm-0.33.0)")
    stored.add_argument("--evict", action="append", default=[], metavar="GROUP:BOUNDARY[:RANK]",
                        help="an object evicted from one rank, or from every rank without RANK (repeatable)")
    sch = e.add_argument_group("how the stored requests were scheduled (vLLM rule sets; default: the block schedule, "
                               "a chunk at every Mamba block end)")
    sch.add_argument("--chunk-budget", type=int, metavar="B",
                     help="max_num_batched_tokens each prefill step (vLLM serve's default on H100/H200: 8192)")
    sch.add_argument("--no-chunked-prefill", action="store_true",
                     help="enable_chunked_prefill off (a prompt over the budget is never scheduled)")
    sch.add_argument("--checkpoint-alignment", type=int, metavar="A",
                     help="prefill checkpoint blocks export the checkpoint inside a chunk (FlashKDA: 16)")
    sch.add_argument("--long-prefill-threshold", type=int, metavar="T", help="long_prefill_token_threshold")
    sch.add_argument("--stop-every", type=int, metavar="K",
                     help="kvspec's proposal (not in vLLM): also end a prefill chunk at every multiple of K tokens")
    look = e.add_argument_group("the lookup")
    look.add_argument("--prompt", type=int, metavar="N", help="the looked-up request's length in tokens (required)")
    rules = look.add_mutually_exclusive_group()
    rules.add_argument("--rules", choices=list(RULE_SETS), metavar="NAME",
                       help=f"rule set: {', '.join(RULE_SETS)} (default {DEFAULT_RULES}, the newest shipped engine)")
    rules.add_argument("--legacy-tail-key", action="store_true",
                       help="alias of --rules legacy (the loader before #53324)")
    out = e.add_argument_group("input and output")
    out.add_argument("--scenarios", metavar="FILE",
                     help="JSON lines, one scenario each (keys as in --json's input; - for stdin); one result line "
                          "each, an error object for a bad line; excludes the flags above")
    out.add_argument("--json", action="store_true", help="print the result (and errors) as JSON on stdout")
    out.add_argument("--explicit", action="store_true",
                     help="list E and the load plan object by object even past the explicit limit (where they are "
                          "otherwise runs: first..last by step; the listing grows with the prompt)")
    out.add_argument("--svg", metavar="FILE",
                     help="also draw the block layout (every group and rank; loaded, missing, stored blocks; "
                          "the unit grid, h and the tail keys) as SVG")
    out.add_argument("--ranks", action="store_true",
                     help="also print, per DCP rank, the token slots of each planned block, its key and presence")
    out.add_argument("--check", action="store_true",
                     help="exit 1 when a planned load key is not present or a scenario fails")
    v = sub.add_parser("verify", help="run the proofs, exhaustive checks and mutants (make verify)")
    v.add_argument("--json", action="store_true")
    v.add_argument("--fast", action="store_true", help="a quick subset (seconds)")
    v.add_argument("--full", action="store_true",
                   help="every property row (BEST, RESEND, MONO-*, CONTENT) over every geometry of its scope "
                        "instead of a sample (make verify-full; several minutes)")
    v.add_argument("--junit", metavar="FILE", help="also write the table as JUnit XML (one testcase per row)")
    v.add_argument("--quiet", action="store_true", help="no progress line on stderr as each task ends")
    v.add_argument("--list", action="store_true", help="print the check ids (with --only: those it selects) and exit")
    v.add_argument("--only", nargs="+", metavar="ID", help="run only these checks (shell patterns: 'I-2*', 'MUT-*')")
    c = sub.add_parser("conform", help="compare a rule set with an engine's own code (vllm: the installed vLLM "
                                       "release's functions; vllm-lifecycle: its real scheduler)")
    c.add_argument("engine", nargs="?", choices=["vllm", "vllm-lifecycle", "sglang"],
                   help="the engine whose code is the oracle: vllm drives the connector's functions one by one, "
                        "vllm-lifecycle runs the real Scheduler, KV-cache manager and every rank's transfer threads "
                        "(needs a vLLM release importable: make vllm-venv, then .venv-vllm/bin/kvspec conform vllm); "
                        "sglang runs SGLang 0.5.23's HiCache write, hit and load code from its unpacked wheel "
                        "(make sglang-src; --root)")
    c.add_argument("--root", metavar="DIR", help="sglang only: the unpacked sglang==0.5.23 wheel with its page hash "
                                                 "built (make sglang-src; default $KVSPEC_SGLANG_ROOT, else "
                                                 ".cache/sglang-0.5.23)")
    c.add_argument("--adapter", metavar="MODULE:OBJECT",
                   help="an engine adapter (checks/conform/adapters.py protocol), e.g. kvspec.checks.conform.adapters:IMPL: the "
                        "explain vectors of --rules, then a Hypothesis search, shrunk to an explain command")
    c.add_argument("--rules", choices=list(RULE_SETS), metavar="NAME",
                   help=f"the rule set compared with the engine's answers (default {DEFAULT_RULES}): the one the adapter "
                        f"claims, or for vllm the one held against vLLM's code")
    c.add_argument("--examples", type=int, help="--adapter only: scenarios the search tries after the vectors (300)")
    c.add_argument("--no-shrink", action="store_true",
                   help="--adapter only: report the search's first disagreement as drawn, not shrunk to a minimal "
                        "scenario (same verdict, a fraction of the time: for a port's CI; debug with shrinking)")
    c.add_argument("--count", type=int, help="vllm, vllm-lifecycle: generated scenarios, plus the worked examples "
                                             "(2000)")
    c.add_argument("--seed", type=int, default=0, help="seed of the scenario generator")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    k = sub.add_parser("keys", help="parse store keys, or check a key dump against a geometry")
    ksub = k.add_subparsers(dest="keys_cmd", required=True, parser_class=_Parser)
    kp = ksub.add_parser("parse", help="print the fields of one key (names the field that breaks the grammar)")
    kp.add_argument("key", help="one key string")
    kp.add_argument("--grammar", choices=list(KEY_GRAMMARS), default=GRAMMAR_KVSPEC,
                    help="kvspec's escaped grammar, or vLLM 0.33.0's (read from the right; prefix/model splits listed)")
    kp.add_argument("--json", action="store_true", help="print the fields as JSON")
    kc = ksub.add_parser("check", help="which DCP ranks hold each object of a key dump, and the spec on what all hold",
                         description="Read a newline list of keys (mooncake_master's /get_all_keys), group them by "
                                     "object and report the ranks that lack each one (an object is in E only when "
                                     "every rank holds it). With --tokens, map each hash to its boundary and run "
                                     "the spec's lookup and load plan on E.")
    kc.add_argument("--keys", required=True, metavar="FILE", help="the key dump, one key per line (- for stdin)")
    kc.add_argument("--grammar", choices=list(KEY_GRAMMARS), default=GRAMMAR_KVSPEC, help="the dump's key grammar")
    kc.add_argument("--tokens", metavar="FILE", help="the request's token ids as a JSON list (maps hashes to t)")
    kc.add_argument("--rules", choices=list(RULE_SETS), default=DEFAULT_RULES,
                    help="rule set of the lookup (its λ also shapes the hashes)")
    kc.add_argument("--hash-algo", choices=["kvspec", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
                    help="how the dump's engine hashes blocks: vLLM's prefix_caching_hash_algo (default sha256 for a "
                         "vllm-0.33.0 dump), or kvspec's own chain (default for a kvspec dump)")
    kc.add_argument("--hash-seed", metavar="SEED",
                    help="the deployment's PYTHONHASHSEED (vLLM roots its chain in it; unset: vLLM's default seed)")
    kc.add_argument("--cache-salt", metavar="SALT", help="the request's cache_salt (it enters the first block's hash)")
    _add_geometry_args(kc)
    kc.add_argument("--json", action="store_true", help="print the report as JSON")
    vec = sub.add_parser("vectors", help="write the language-neutral test vectors (vectors/README.md)")
    vec.add_argument("--out", required=True, metavar="DIR",
                     help="a new or empty folder to write them to (a folder holding anything but vectors is refused)")
    vec.add_argument("--force", action="store_true", help="replace DIR when it already holds a vectors tree")
    vec.add_argument("--check", action="store_true",
                     help="regenerate elsewhere and compare with DIR instead: exit 1 on any difference")
    m = sub.add_parser("model", help="one scenario on the tiny real model: D rank processes with real DCP attention "
                                     "on a real mooncake_master (needs torch and mooncake)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Store a request computed by the tiny hybrid model (Mamba2-style layers, MLA-style "
                                   "attention across the DCP ranks, an EAGLE draft layer with a drafter), look up and "
                                   "load a second one, compute it from the hit and decode; run it cold too. Prints the "
                                   "hit (and kvspec explain's), what each rank loaded, cold and warm tokens, bitwise "
                                   "equal or the first differing position, draft acceptance, and the time split.",
                       epilog="example:\n  kvspec model --unit 4 --group attention:8:eagle --group mamba:8 --dcp 2 "
                              "--stored-prompt 80 --shared 61 --prompt 90 --rules vllm-0.34.0\n"
                              "exit status: 0 warm == cold bitwise; 1 they differ; 2 bad input")
    _add_geometry_args(m)
    m.add_argument("--stored-prompt", type=int, required=True, metavar="P", help="the stored request's tokens")
    m.add_argument("--shared", type=int, metavar="S", help="tokens it shares with the lookup (default min(P, N))")
    m.add_argument("--prompt", type=int, required=True, metavar="N", help="the looked-up request's tokens")
    m.add_argument("--rules", choices=list(RULE_SETS), metavar="NAME", default=DEFAULT_RULES,
                   help=f"rule set: {', '.join(RULE_SETS)} (default {DEFAULT_RULES})")
    m.add_argument("--json", action="store_true", help="print the report as JSON")
    b = sub.add_parser("bench", help="lookup-probe and transfer benchmarks (needs torch and mooncake)")
    b.add_argument("--json", action="store_true", help="print the results as one JSON object (default: a summary)")
    b.add_argument("--quick", action="store_true", help="smaller sweeps (about a minute)")
    b.add_argument("--transfer-only", action="store_true", help="only the transfer bench (the GPU check runs this)")
    b.add_argument("--dcp", type=int, action="append", choices=[1, 2, 4, 8], metavar="D",
                   help="DCP sizes of the transfer bench (repeatable; default 2 and 4, quick: 2)")
    b.add_argument("--tokens", type=int, metavar="N", help="tokens of the transfer bench's request (default 32768)")
    b.add_argument("--efficiency-only", action="store_true",
                   help="only the cache-efficiency tables (identical resends, multi-turn conversations; no store needed)")
    b.add_argument("--deadline-only", action="store_true",
                   help="only the lookup-deadline table: vLLM's lookup call pattern and kvspec's on a real master, "
                        "D = 1 and 8, 32k to 16M tokens, against vLLM 0.34.0's 1 s deadline")
    b.add_argument("--plot", metavar="FILE", help="also draw the identical-resend hit against the prompt length per "
                   "rule set (matplotlib; PNG, SVG or PDF by the file's extension)")
    return p


REPEATED = ("--group", "--stored", "--evict")  # explain's repeatable flags (10^4 evictions are an ordinary input)


def _gather_repeated(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Return argv without explain's `--flag VALUE` / `--flag=VALUE` pairs of the repeatable flags, and each flag's
    values in order. argparse's cost is quadratic in the number of option strings (2 · 10^4 took 4 s of CPU); the
    pairs are taken out before it parses. A flag written abbreviated (`--evi`) anywhere, a value starting with `-`
    or a `--` separator leave the flag to argparse (its order and errors are then argparse's own)."""
    if not argv or argv[0] != "explain" or "--" in argv:
        return argv, {}
    rest = [argv[0]]
    flags = [f for f in REPEATED
             if not any(a != f and len(a) > 2 and f.startswith(a) for a in argv[1:])]  # no abbreviation of f
    values: dict[str, list[str]] = {f: [] for f in flags}
    i = 1
    while i < len(argv):
        a = argv[i]
        head, eq, tail = a.partition("=")
        if eq and head in values:
            values[head].append(tail)
            i += 1
        elif a in values and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            values[a].append(argv[i + 1])
            i += 2
        else:
            rest.append(a)
            i += 1
    return rest, {f.lstrip("-"): v for f, v in values.items() if v}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the kvspec command line; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _JSON_ERRORS[0] = "--json" in argv  # known before parsing, so a usage error is JSON too
    parser = build_parser()
    if not argv:
        _die("cli-usage", "give a command: explain, verify, conform, keys, vectors, model or bench (kvspec --help; "
                          "kvspec COMMAND --help)", usage=parser.format_usage())
    argv, gathered = _gather_repeated(argv)
    args = parser.parse_args(argv)
    for name, values in gathered.items():
        setattr(args, name, values + getattr(args, name))
    try:
        if args.cmd == "explain":
            return _explain(args)
        if args.cmd == "conform":
            return _conform(args)
        if args.cmd == "keys":
            return _keys(args)
        if args.cmd == "model":
            _need("torch", "impl", "kvspec model")
            _need("mooncake.store", "mooncake-cpu", "kvspec model")
            from kvspec.checks.cli.model_cmd import run_model_command
            shared = args.shared if args.shared is not None else min(args.stored_prompt, args.prompt)
            return run_model_command(_geometry(args), args.rules, args.stored_prompt, shared, args.prompt, args.json)
        if args.cmd == "vectors":
            if args.check:
                _refuse_flags(args, "vectors --check (it writes nothing)", ("force",))
            from kvspec.checks.conform.vectors import run_vectors
            return run_vectors(args.out, check=args.check, force=args.force)
        if args.cmd == "verify":
            if args.list:
                _refuse_flags(args, "verify --list (it runs nothing)", ("json", "fast", "full", "junit"))
            if args.fast and args.full:
                raise SpecError("cli-usage", "--fast (a sample) and --full (every geometry) exclude each other")
            _need("z3", "verify", "kvspec verify")
            from kvspec.checks.verify.runner import run_verify
            return run_verify(json_out=args.json, fast=args.fast, junit=args.junit, progress=not args.quiet,
                              only=tuple(args.only or ()), list_only=args.list, full=args.full)
        if args.efficiency_only and args.transfer_only:
            _die("cli-usage", "--efficiency-only and --transfer-only exclude each other")
        if args.deadline_only:
            _refuse_flags(args, "bench --deadline-only (only the lookup-deadline table)",
                          ("efficiency_only", "transfer_only", "dcp", "tokens", "plot", "quick"))
        if args.efficiency_only:
            _refuse_flags(args, "bench --efficiency-only (no transfer bench runs)", ("dcp", "tokens"))
        if args.transfer_only:
            _refuse_flags(args, "bench --transfer-only (no efficiency table is drawn)", ("plot",))
        if not args.efficiency_only:
            _need("torch", "impl", "kvspec bench")
            _need("mooncake.store", "mooncake-cpu", "kvspec bench")
        if args.plot:
            _need("matplotlib", "plot", "kvspec bench --plot")
        from kvspec.checks.bench.runner import run_bench
        return run_bench(quick=args.quick, transfer_only=args.transfer_only, json_out=args.json,
                         dcps=tuple(args.dcp) if args.dcp else None, tokens=args.tokens,
                         efficiency_only=args.efficiency_only, plot=args.plot, deadline_only=args.deadline_only)
    except SpecError as err:
        _die(err.rule, err.message)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
