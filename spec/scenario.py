"""A scenario (geometry, what was stored, one lookup) and its evaluation through the whole spec.

Also the explicit, versioned JSON encoding of scenarios and results that ``kvspec explain``
and the test vectors use (attrs is not a serializer).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs

from .boundaries import Objects, compute_objects_union
from .errors import SpecError, require
from .failure import compute_retry_cap, compute_safe_boundary
from .geometry import (
    GEOMETRY_KEYS,
    Geometry,
    compute_alignment,
    compute_lcm_span,
    compute_span,
    compute_spans,
    decode_geometry_input,
    encode_geometry_input,
    is_fine,
)
from .limits import (
    MAX_CHUNK_ENDS,
    MAX_EVICTED,
    MAX_PROMPT,
    MAX_SHARDS,
    MAX_STORED,
    RULE_LIMIT_CHUNKS,
    RULE_LIMIT_EVICTED,
    RULE_LIMIT_PROMPT,
    RULE_LIMIT_SHARDS,
    RULE_LIMIT_STORED,
    check_count,
    compute_longest_prompt,
    compute_shard_bound,
)
from .lookup import LookupResult, ObjSet, compute_lookup, compute_tail_boundaries
from .plan import LoadEntry, LoadRun, plan_load, plan_load_runs
from .rules import (
    DEFAULT_RULES,
    LEGACY_SWITCH_RULES,
    RULE_SETS,
    STORE_SGLANG,
    STORE_VLLM_0_33,
    RuleSet,
    check_config,
    coerce_optional_rules,
    coerce_rules,
    compute_lookahead,
    compute_rule_geometry,
    get_rules,
)
from .schedule import BLOCK_SCHEDULE, RULE_SCHEDULE, Schedule, compute_checkpoints
from .store import (
    Obj,
    RankObj,
    compute_present_after,
    compute_present_after_objects,
    compute_rank_objects,
    compute_rule_deferred,
    compute_rule_deferred_objects,
    compute_rule_objects,
    compute_rule_store,
    compute_visible,
    compute_visible_objects,
)
from .types import Boundary, GroupId, Rank, Tokens

RULE_SCENARIO = "scenario"
RULE_DECODED = "decoded-writer"
RULE_STORED = "stored-object"
RULE_EVICTED = "evicted-shard"
RESULT_VERSION = 3  # 2: "rules" (a rule set name) replaces "rule"; 3: the input scenario echoed as "input"


def _int(x: object, what: str, lo: int = 0, rule: str = RULE_SCENARIO) -> int:
    if type(x) is int and x >= lo:  # the common case, one test (bool is a subclass of int, not int itself)
        return x
    if not isinstance(x, int) or isinstance(x, bool):
        raise SpecError(rule, f"{what} must be an integer, got {x!r}")
    if x < lo:
        raise SpecError(rule, f"{what} must be >= {lo}, got {x}")
    return x


def _repr_rules(rules: RuleSet | None) -> str:
    """Return how a scenario's repr names a rule set: by name (a mutant's, whose steps differ, marked so)."""
    if rules is None:
        return "None"
    return repr(rules.name) if rules.stages is None else f"{rules.name!r} (a mutant's steps)"


@attrs.frozen(kw_only=True)
class StoredRequest:
    """A request of P prompt tokens that was stored; it shares its first S tokens with the lookup request; its own
    schedule, when it differs from the scenario's (e.g. observed chunk ends); the rule set of the engine that stored
    it, when it differs from the reader's (a mixed fleet); the tokens it decoded before it finished (0: not finished,
    or nothing decoded) — a reader that continues the conversation shares up to P + O tokens with it; whether its
    engine saved the decode phase (vLLM's save_decode_cache)."""

    prompt: int
    shared: int
    schedule: Schedule | None = None
    rules: RuleSet | None = attrs.field(default=None, converter=coerce_optional_rules, repr=_repr_rules)
    decoded: int = 0
    save_decode_cache: bool = False  # its connector saved the decode phase too (vLLM's save_decode_cache)


def has_outputs(request: StoredRequest) -> bool:
    """Return whether the writer stores past its prefill: it decoded before finishing, or saved its decode phase."""
    return bool(request.decoded or request.save_decode_cache)


@attrs.frozen(kw_only=True, cache_hash=True)
class Scenario:
    """A geometry, the stored requests (or an explicit present set), evictions, one lookup of N tokens."""

    geometry: Geometry
    prompt: int
    stored: tuple[StoredRequest, ...] = ()
    objects: frozenset[Obj] | None = None  # explicit present objects instead of stored requests
    evicted: frozenset[RankObj] = frozenset()
    rules: RuleSet = attrs.field(default=RULE_SETS[DEFAULT_RULES], converter=coerce_rules,  # a name: its rule set
                                 repr=_repr_rules)
    schedule: Schedule = BLOCK_SCHEDULE  # how the stored requests' prefills were scheduled (spec/schedule.py)

    def __attrs_post_init__(self) -> None:
        check_count(_int(self.prompt, "prompt", 1), MAX_PROMPT, RULE_LIMIT_PROMPT, "prompt")
        rules = self.rules
        check_config(rules, self.geometry)
        for sched in {self.schedule, *(r.schedule for r in self.stored if r.schedule is not None)} - {BLOCK_SCHEDULE}:
            require(isinstance(sched, Schedule), RULE_SCHEDULE, "schedule must be a Schedule")
            require(rules.store == STORE_VLLM_0_33, RULE_SCHEDULE,
                    f"rule set {rules.name} states its store rule for the block schedule (a Mamba state at every "
                    f"block end); a chunk budget applies to a vLLM rule set (vllm-0.33.0, vllm-0.34.0, ...)")
            require(self.objects is None, RULE_SCHEDULE, "a schedule applies to stored requests, not explicit objects")
        check_count(len(self.stored), MAX_STORED, RULE_LIMIT_STORED, "stored request count")
        for r in self.stored:
            if r.rules is not None:  # a writer of a mixed fleet: its rule set must admit the geometry too
                require(self.objects is None, RULE_SCENARIO, "a writer's rule set applies to stored requests")
                check_config(r.rules, self.geometry)
                require((r.schedule or self.schedule) == BLOCK_SCHEDULE or r.rules.store == STORE_VLLM_0_33,
                        RULE_SCHEDULE, f"a chunk budget applies to a vLLM writer, not to {r.rules.name}")
            check_count(_int(r.prompt, "stored prompt", 0), MAX_PROMPT, RULE_LIMIT_PROMPT, "stored prompt")
            _int(r.shared, "shared", 0)
            check_count(_int(r.decoded, "decoded", 0), MAX_PROMPT, RULE_LIMIT_PROMPT, "decoded tokens")
            require(not r.decoded or (r.rules or self.rules).store != STORE_SGLANG, RULE_DECODED,
                    "SGLang inserts a finished request's outputs into its radix tree too (cache_finished_req); kvspec "
                    "states an SGLang writer's prompt only: give decoded 0 under an SGLang rule set")
            require(not r.save_decode_cache or (r.rules or self.rules).store == STORE_VLLM_0_33, RULE_DECODED,
                    f"save_decode_cache is a vLLM connector option: the writer's rule set "
                    f"{(r.rules or self.rules).name} states no decode-phase saves")
            if r.shared > min(r.prompt + r.decoded, self.prompt):
                raise SpecError(RULE_SCENARIO, f"shared {r.shared} exceeds min(stored prompt {r.prompt}"
                                               f"{f' + decoded {r.decoded}' if r.decoded else ''}, prompt {self.prompt})")
        g = self.geometry
        spans = compute_spans(g)
        longest, extra = max([self.prompt, *(r.prompt for r in self.stored)]), len(self.objects or ()) + len(self.evicted)
        shards = compute_shard_bound(g.parallel.dcp, spans, longest, len(self.stored), extra)
        if shards > MAX_SHARDS and self.objects is None:  # answered on runs and points (spec/boundaries.py)
            check_count(len(self.evicted), MAX_EVICTED, RULE_LIMIT_EVICTED, "evicted shard count")
        elif shards > MAX_SHARDS:  # the message's longest prompt costs a search: only on the way out
            raise SpecError(RULE_LIMIT_SHARDS,
                            f"this scenario names up to {shards} rank shards (D x blocks of every group), past the "
                            f"limit {MAX_SHARDS} (spec/limits.py); this geometry takes prompts up to "
                            f"{compute_longest_prompt(g.parallel.dcp, spans, len(self.stored), extra)} tokens here: "
                            f"use a shorter prompt, a larger unit or block size, or a smaller D")
        for gid, t, rank in self.evicted:  # a shard no deployment holds would be a silent no-op: refuse it by name
            require(isinstance(gid, int) and 0 <= gid < len(g.groups), RULE_EVICTED,
                    f"evicted group {gid!r} is not a group of the geometry (0..{len(g.groups) - 1})")
            require(isinstance(rank, int) and 0 <= rank < g.parallel.dcp, RULE_EVICTED,
                    f"evicted rank {rank!r} outside 0..{g.parallel.dcp - 1} (D = {g.parallel.dcp})")
            require(isinstance(t, int) and t >= 1 and t % g.unit == 0, RULE_EVICTED,
                    f"evicted boundary {t!r} is not a positive multiple of the unit {g.unit} (a key's boundary)")
        if self.objects is not None:
            u, top = self.geometry.unit, self.prompt // self.geometry.unit * self.geometry.unit
            for gid, t in self.objects:
                _int(gid, "stored group", 0, RULE_STORED)
                if gid >= len(self.geometry.groups):
                    raise SpecError(RULE_STORED, f"group {gid} is not a group of the geometry")
                _int(t, "stored boundary", 1, RULE_STORED)
                if t % u != 0:
                    raise SpecError(RULE_STORED, f"boundary {t} is not a multiple of the unit {u}")
                if t > top:
                    raise SpecError(RULE_STORED,
                                    f"boundary {t} is past the lookup request's last hash boundary {top}")
        rg, chunks = compute_rule_geometry(rules, g), 0
        for r in self.stored:  # refuse an unschedulable prompt here, not half-way through a lookup
            if (r.schedule or self.schedule) != BLOCK_SCHEDULE:  # each schedule stops past MAX_CHUNK_ENDS by itself
                chunks += len(compute_checkpoints(r.schedule or self.schedule, rg, Tokens(r.prompt),
                                                  compute_lookahead(rules, g)).ends)
                check_count(chunks, MAX_CHUNK_ENDS, RULE_LIMIT_CHUNKS, "chunk count of the stored prefills' schedules")


@attrs.frozen(kw_only=True, cache_hash=True)  # a memo key of every stored-set read
class Stages:
    """The spec's replaceable rules, the one extension point: every mutant (checks/verify/mutants.py) is a variant."""

    store: Callable[[RuleSet, Geometry, Tokens, Schedule], frozenset[Obj]] = compute_rule_store
    present: Callable[[Geometry, frozenset[Obj], frozenset[RankObj]], frozenset[Obj]] = compute_present_after
    lookup: Callable[..., LookupResult] = compute_lookup  # (geometry, E, N, lookahead=λ)
    tails: Callable[..., tuple[tuple[GroupId, Boundary], ...]] = compute_tail_boundaries
    plan: Callable[..., tuple[LoadEntry, ...]] = plan_load
    safe: Callable[..., Tokens] = compute_safe_boundary  # (geometry, E, h, plan, ok): the failure closure
    retry: Callable[..., Tokens | None] = compute_retry_cap  # (failed loads, safe): the next lookup's cap


SPEC_STAGES = Stages()


def compute_stages(rules: RuleSet) -> Stages:
    """Return the steps a rule set evaluates with: its own (a mutant's, rules.stages), else the spec's (SPEC_STAGES)."""
    return SPEC_STAGES if rules.stages is None else rules.stages


@attrs.frozen(kw_only=True)
class Outcome:
    """What the spec says happens: E, the lookup, tail boundaries, the load plan."""

    present: ObjSet
    lookup: LookupResult | None
    tails: tuple[tuple[GroupId, Boundary], ...]
    load: tuple[LoadEntry, ...]  # () for a compact scenario: its plan is load_runs
    error: SpecError | None = None
    load_runs: tuple[LoadRun, ...] | None = None  # a compact scenario's plan, a run per group (spec/plan.py)

    @property
    def hit_length(self) -> Tokens:
        """Return h (0 when the evaluation stopped on an error)."""
        return Tokens(self.lookup.hit_length if self.lookup else 0)


def is_compact(scenario: Scenario) -> bool:
    """Return whether the scenario names more rank shards than the explicit spec lists (spec/limits.py: MAX_SHARDS): it
    is then answered on runs and points (spec/boundaries.py), with the spec's own stages only."""
    g = scenario.geometry
    longest = max([scenario.prompt, *(r.prompt for r in scenario.stored)])
    return scenario.objects is None and compute_shard_bound(
        g.parallel.dcp, compute_spans(g), longest, len(scenario.stored), len(scenario.evicted)) > MAX_SHARDS


def compute_stored(scenario: Scenario, compact: bool | None = None) -> ObjSet:
    """Return every object the lookup request can name (each written by every rank), before evictions; as runs and
    points when `compact` (default: when is_compact)."""
    if scenario.objects is not None:
        return scenario.objects
    if is_compact(scenario) if compact is None else compact:
        require(scenario.rules.stages is None, RULE_LIMIT_SHARDS, "a scenario past the explicit limit is answered "
                                                                   "with the spec's own stages only")
        return _compute_stored_compact(scenario.geometry, scenario.rules, scenario.stored, scenario.schedule)
    return _compute_stored_of(scenario.geometry, scenario.rules, scenario.stored, scenario.schedule)


def compute_writer_lookahead(g: Geometry, reader: RuleSet, request: StoredRequest) -> int | None:
    """Return the λ the request's writer hashed with, or None when it is not the reader's: a key H'_t (λ > 0) names
    [0, t + λ) and H_t names [0, t), so two engines hashing with different λ name no common key — vLLM's key carries
    no λ marker, and a mixed fleet's objects are each other's misses (never each other's bytes)."""
    lw = compute_lookahead(request.rules or reader, g)
    return lw if lw == compute_lookahead(reader, g) else None


def compute_request_visible(g: Geometry, reader: RuleSet, request: StoredRequest,
                            schedule: Schedule = BLOCK_SCHEDULE) -> frozenset[Obj]:
    """Return the objects one stored request shows the reader: its writer's store rule (the request's rule set, else
    the reader's) at P, through the shared prefix S at the writer's λ; none when the λ differ
    (compute_writer_lookahead)."""
    lw = compute_writer_lookahead(g, reader, request)
    if lw is None:
        return frozenset()
    writer = request.rules or reader
    objects = compute_stages(writer).store(writer, g, Tokens(request.prompt), request.schedule or schedule)
    if has_outputs(request):  # what its outputs let it store (store.compute_rule_deferred)
        objects = objects | compute_rule_deferred(writer, g, Tokens(request.prompt), Tokens(request.decoded),
                                                  request.schedule or schedule, request.save_decode_cache)
    return compute_visible(objects, Tokens(request.shared), lw)


def _compute_stored_compact(g: Geometry, reader: RuleSet, stored: tuple[StoredRequest, ...],
                            schedule: Schedule) -> Objects:
    """Return compute_stored's objects as runs and points (compute_request_visible's rule on runs)."""
    parts = []
    for r in stored:
        lw = compute_writer_lookahead(g, reader, r)
        if lw is not None:
            writer = r.rules or reader
            mine = compute_rule_objects(writer, g, Tokens(r.prompt), r.schedule or schedule)
            if has_outputs(r):
                mine = compute_objects_union((mine, compute_rule_deferred_objects(
                    writer, g, Tokens(r.prompt), Tokens(r.decoded), r.schedule or schedule, r.save_decode_cache)))
            parts.append(compute_visible_objects(mine, Tokens(r.shared), lw))
    return compute_objects_union(parts)


@functools.lru_cache(maxsize=1024)  # one set per stored setup: the lookups of every N and eviction share it
def _compute_stored_of(g: Geometry, reader: RuleSet, stored: tuple[StoredRequest, ...],
                       schedule: Schedule = BLOCK_SCHEDULE) -> frozenset[Obj]:
    sets = [compute_request_visible(g, reader, r, schedule) for r in stored]
    return sets[0] if len(sets) == 1 else frozenset().union(*sets)


def compute_stored_objects(scenario: Scenario) -> frozenset[RankObj]:
    """Return every rank shard the lookup request can name, before evictions."""
    return compute_rank_objects(scenario.geometry, compute_stored(scenario))


def compute_scenario_present(scenario: Scenario, compact: bool | None = None) -> ObjSet:
    """Return E: the stored objects less those with an evicted shard (the rule set's present step)."""
    return _compute_scenario_present(scenario, compact)


@functools.lru_cache(maxsize=256)  # the verdict key, the evaluation and the witness all read it
def _compute_scenario_present(scenario: Scenario, compact: bool | None) -> ObjSet:
    g = compute_rule_geometry(scenario.rules, scenario.geometry)
    stored = compute_stored(scenario, compact)
    if isinstance(stored, Objects):
        return compute_present_after_objects(g, stored, scenario.evicted)
    return _compute_present_of(g, stored, scenario.evicted, compute_stages(scenario.rules))


@functools.lru_cache(maxsize=1024)  # scenarios that differ only in N share E, the same set object for the lookup's memos
def _compute_present_of(g: Geometry, stored: frozenset[Obj], evicted: frozenset[RankObj],
                        stages: Stages) -> frozenset[Obj]:
    return stages.present(g, stored, evicted)


def compute_scenario_lookup(scenario: Scenario, compact: bool | None = None) -> tuple[Geometry, ObjSet, LookupResult]:
    """Return (the rule set's geometry, E after evictions, the lookup of N) of a scenario."""
    rules = scenario.rules
    g = compute_rule_geometry(rules, scenario.geometry)
    present = compute_scenario_present(scenario, compact)
    return g, present, compute_stages(rules).lookup(g, present, Tokens(scenario.prompt),
                                     lookahead=compute_lookahead(rules, scenario.geometry))


def compute_hit(scenario: Scenario) -> Tokens:
    """Return h of the scenario's lookup (evaluate_scenario's, without tails and plan)."""
    return compute_scenario_lookup(scenario)[2].hit_length


def evaluate_scenario(scenario: Scenario, compact: bool | None = None) -> Outcome:
    """Return the outcome of a scenario; a violated rule during lookup is reported, not raised. `compact`: E as runs
    and points and the plan as runs (default: past the explicit limit, is_compact); the cross-check forces it."""
    rules, n = scenario.rules, Tokens(scenario.prompt)
    stages = compute_stages(rules)
    g, present, look = compute_scenario_lookup(scenario, compact)
    try:
        tails = stages.tails(g, present, n, look.hit_length, rules.tail_key,
                             compute_lookahead(rules, scenario.geometry))
    except SpecError as err:
        return Outcome(present=present, lookup=look, tails=(), load=(), error=err)
    if isinstance(present, Objects):
        return Outcome(present=present, lookup=look, tails=tails, load=(),
                       load_runs=plan_load_runs(g, present, look.hit_length, tails))
    return Outcome(present=present, lookup=look, tails=tails,
                   load=stages.plan(g, present, look.hit_length, tails))


# ---------------------------------------------------------------- JSON encoding (explicit)

def encode_geometry(geometry: Geometry) -> dict[str, Any]:
    """Return the JSON object of a geometry with its derived quantities."""
    return {"dcp": geometry.parallel.dcp, "unit": geometry.unit, "lcm_span": compute_lcm_span(geometry),
            "fine": is_fine(geometry), "alignment": compute_alignment(geometry), "retention": geometry.retention,
            "groups": [{"id": i, "kind": gr.kind, "block_size": gr.block_size,
                        "span": compute_span(geometry, GroupId(i)), "eagle": gr.eagle}
                       for i, gr in enumerate(geometry.groups)]}


def encode_stored_runs(present: Objects) -> list[dict[str, Any]]:
    """Return E in the compact form: per group its runs [first, step, last], its points and its holes (evicted)."""
    return [{"group": g, "runs": [list(r) for r in b.runs], "points": list(b.points), "evicted": sorted(b.holes)}
            for g, b in present.groups]


def encode_outcome(scenario: Scenario, outcome: Outcome, explicit: bool = False) -> dict[str, Any]:
    """Return the `kvspec explain --json` object of an evaluated scenario; a compact one's E and plan as runs
    ("form": "compact") unless `explicit` (listed, as for every other scenario: cost grows with the prompt)."""
    err = outcome.error
    if outcome.load_runs is not None and isinstance(outcome.present, Objects) and not explicit:
        return {
            "version": RESULT_VERSION, "form": "compact", "input": encode_scenario(scenario),
            "geometry": encode_geometry(scenario.geometry), "rules": scenario.rules.name, "prompt": scenario.prompt,
            "stored": encode_stored_runs(outcome.present),
            "hit_length": outcome.hit_length,
            "tail_boundaries": [{"group": gid, "boundary": t} for gid, t in outcome.tails],
            "load": [{"group": r.group, "first_block": r.first, "last_block": r.last, "span": r.span,
                      "tail_key": r.tail_key, "absent_blocks": list(r.absent)} for r in outcome.load_runs],
            "error": None if err is None else {"rule": err.rule, "message": err.message},
        }
    load = outcome.load if outcome.load_runs is None else tuple(e for r in outcome.load_runs for e in r.entries())
    return {
        "version": RESULT_VERSION,
        "input": encode_scenario(scenario),
        "geometry": encode_geometry(scenario.geometry),
        "rules": scenario.rules.name,
        "prompt": scenario.prompt,
        "stored": [{"group": gid, "boundary": t} for gid, t in sorted(outcome.present)],
        "hit_length": outcome.hit_length,
        "tail_boundaries": [{"group": gid, "boundary": t} for gid, t in outcome.tails],
        "load": [{"group": e.group, "block": e.block, "start": e.start, "end": e.end,
                  "key_boundary": e.key_boundary, "present": e.present} for e in load],
        "error": None if err is None else {"rule": err.rule, "message": err.message},
    }


def encode_error(err: SpecError) -> dict[str, Any]:
    """Return the JSON result of a scenario that could not be built."""
    return {"version": RESULT_VERSION, "geometry": None, "stored": [], "hit_length": 0, "tail_boundaries": [],
            "load": [], "error": {"rule": err.rule, "message": err.message}}


_SCENARIO_KEYS = {*GEOMETRY_KEYS, "stored_prompt", "stored", "prompt", "shared", "legacy", "rules", "requests",
                  "evicted", "schedule"}
_SCHEDULE_KEYS = {"budget", "chunked", "checkpoint_alignment", "long_prefill_threshold", "stop_every", "ends",
                  "starts", "junctions"}


def encode_schedule(schedule: Schedule) -> dict[str, Any]:
    """Return the JSON object of a schedule (only the fields that differ from the block schedule's)."""
    return {k: list(v) if k in ("ends", "starts", "junctions") else v for k, v in attrs.asdict(schedule).items()
            if v != getattr(BLOCK_SCHEDULE, k)}


def decode_schedule(raw: object) -> Schedule:
    """Return the Schedule of a JSON object {"budget": B, "chunked": bool, "checkpoint_alignment": A, ...}."""
    require(isinstance(raw, dict), RULE_SCHEDULE, "schedule must be a JSON object")
    extra = set(cast(dict[str, Any], raw)) - _SCHEDULE_KEYS
    require(not extra, RULE_SCHEDULE, f"unknown schedule keys: {', '.join(sorted(extra))} "
                                      f"(known: {', '.join(sorted(_SCHEDULE_KEYS))})")
    fields = dict(cast(dict[str, Any], raw))
    for key in ("ends", "starts", "junctions"):
        if key in fields:
            require(isinstance(fields[key], list), RULE_SCHEDULE, f"schedule {key} must be a JSON list")
            fields[key] = tuple(fields[key])
    return Schedule(**fields)


def encode_scenario(scenario: Scenario) -> dict[str, Any]:
    """Return the JSON object of a scenario (the input format of --scenarios and of the vectors); decodes back equal."""
    out: dict[str, Any] = {**encode_geometry_input(scenario.geometry), "rules": scenario.rules.name,
                           "prompt": scenario.prompt}
    if scenario.objects is not None:
        out["stored"] = [{"group": gid, "boundary": t} for gid, t in sorted(scenario.objects)]
    else:
        out["requests"] = [{"prompt": r.prompt, "shared": r.shared,
                            **({"schedule": encode_schedule(r.schedule)} if r.schedule is not None else {}),
                            **({"rules": r.rules.name} if r.rules is not None else {}),
                            **({"decoded": r.decoded} if r.decoded else {}),
                            **({"save_decode_cache": True} if r.save_decode_cache else {})}
                           for r in scenario.stored]
    if scenario.evicted:
        out["evicted"] = [{"group": gid, "boundary": t, "rank": r} for gid, t, r in sorted(scenario.evicted)]
    if scenario.schedule != BLOCK_SCHEDULE:
        out["schedule"] = encode_schedule(scenario.schedule)
    return out


def decode_requests(raw: object) -> tuple[StoredRequest, ...]:
    """Return the stored requests of a JSON list of {"prompt": P, "shared": S[, "schedule": {...}][, "rules": NAME]
    [, "decoded": O][, "save_decode_cache": true]} (rules: the writer's rule set, when not the reader's; decoded: tokens
    it decoded before finishing; save_decode_cache: its connector saved the decode phase)."""
    require(isinstance(raw, list), RULE_SCENARIO, "requests must be a JSON list")
    out = []
    for item in cast(list[Any], raw):
        require(isinstance(item, dict) and {"prompt", "shared"} <= set(item) <= _REQUEST_KEYS,
                RULE_SCENARIO, f"each request is {{\"prompt\": P, \"shared\": S[, \"schedule\": {{...}}][, \"rules\": "
                               f"NAME][, \"decoded\": O][, \"save_decode_cache\": true]}}, got {item!r}")
        writer = item.get("rules")
        require(writer is None or isinstance(writer, str), RULE_SCENARIO, f"a request's rules is a rule set name, "
                                                                          f"got {writer!r}")
        out.append(StoredRequest(prompt=_int(item["prompt"], "request prompt", 0),
                                 shared=_int(item["shared"], "request shared", 0),
                                 schedule=decode_schedule(item["schedule"]) if "schedule" in item else None,
                                 rules=get_rules(writer) if writer is not None else None,
                                 decoded=_int(item.get("decoded", 0), "request decoded", 0),
                                 save_decode_cache=_bool(item.get("save_decode_cache", False), "save_decode_cache")))
    return tuple(out)


def _bool(x: object, what: str) -> bool:
    require(isinstance(x, bool), RULE_SCENARIO, f"{what} must be true or false, got {x!r}")
    return bool(x)


_REQUEST_KEYS = frozenset({"prompt", "shared", "schedule", "rules", "decoded", "save_decode_cache"})


def decode_evicted(raw: object, dcp: int) -> frozenset[RankObj]:
    """Return the evicted rank shards of a JSON list of {"group": g, "boundary": t, "rank": r}."""
    require(isinstance(raw, list), RULE_SCENARIO, "evicted must be a JSON list")
    out: set[RankObj] = set()
    for item in cast(list[Any], raw):
        require(isinstance(item, dict) and set(item) == {"group", "boundary", "rank"}, RULE_SCENARIO,
                f"each evicted shard is {{\"group\": g, \"boundary\": t, \"rank\": r}}, got {item!r}")
        r = _int(item["rank"], "evicted rank", 0)
        require(r < dcp, RULE_SCENARIO, f"evicted rank {r} outside 0..{dcp - 1}")
        out.add((GroupId(_int(item["group"], "evicted group", 0)), Boundary(_int(item["boundary"], "evicted boundary", 1)),
                 Rank(r)))
    return frozenset(out)


def decode_objects(raw: object) -> frozenset[Obj]:
    """Return the objects of a JSON list of {"group": g, "boundary": t}; reject anything else."""
    require(isinstance(raw, list), RULE_STORED, "stored objects must be a JSON list")
    out: set[Obj] = set()
    for item in cast(list[Any], raw):
        require(isinstance(item, dict) and set(item) == {"group", "boundary"}, RULE_STORED,
                f"each stored object is {{\"group\": g, \"boundary\": t}}, got {item!r}")
        g = _int(item["group"], "stored group", 0, RULE_STORED)
        t = _int(item["boundary"], "stored boundary", 1, RULE_STORED)
        require((g, t) not in out, RULE_STORED, f"object (group {g}, boundary {t}) listed twice")
        out.add((GroupId(g), Boundary(t)))
    return frozenset(out)


def decode_scenario(raw: Mapping[str, Any]) -> Scenario:
    """Return the Scenario of one `--scenarios` JSON line; raise SpecError naming the rule otherwise."""
    require(isinstance(raw, dict), RULE_SCENARIO, "a scenario is a JSON object")
    extra = set(raw) - _SCENARIO_KEYS
    require(not extra, RULE_SCENARIO, f"unknown scenario keys: {', '.join(sorted(extra))}")
    geometry = decode_geometry_input(raw)
    legacy = raw.get("legacy", False)
    require(isinstance(legacy, bool), RULE_SCENARIO, f"legacy must be true or false, got {legacy!r}")
    require(not (legacy and "rules" in raw and raw["rules"] != LEGACY_SWITCH_RULES), RULE_SCENARIO,
            f"legacy: true is the rule set 'legacy', but rules is {raw.get('rules')!r}")
    rules = get_rules(raw.get("rules", LEGACY_SWITCH_RULES if legacy else DEFAULT_RULES))
    require("prompt" in raw, RULE_SCENARIO, "prompt (the lookup request's length) is required")
    n = _int(raw["prompt"], "prompt", 1)
    given = [k for k in ("stored_prompt", "stored", "requests") if k in raw]
    require(len(given) == 1, RULE_SCENARIO, "give exactly one of stored_prompt, requests and stored")
    require("shared" not in raw or given == ["stored_prompt"], RULE_SCENARIO, "shared applies to stored_prompt only")
    evicted = decode_evicted(raw["evicted"], geometry.parallel.dcp) if "evicted" in raw else frozenset()
    schedule = decode_schedule(raw["schedule"]) if "schedule" in raw else BLOCK_SCHEDULE
    if given == ["stored"]:
        return Scenario(geometry=geometry, prompt=n, objects=decode_objects(raw["stored"]), evicted=evicted,
                        rules=rules, schedule=schedule)
    if given == ["requests"]:
        return Scenario(geometry=geometry, prompt=n, stored=decode_requests(raw["requests"]), evicted=evicted,
                        rules=rules, schedule=schedule)
    p = _int(raw["stored_prompt"], "stored_prompt", 0)
    s = raw.get("shared", min(p, n))
    return Scenario(geometry=geometry, prompt=n, stored=(StoredRequest(prompt=p, shared=_int(s, "shared", 0)),),
                    evicted=evicted, rules=rules, schedule=schedule)
