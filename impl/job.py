"""A rank job, typed: what the parent hands every rank process, and the faults a scenario injects.

JSON only at the process boundary (`encode_job` / `decode_job`, strict: an unknown or missing field
is a `JobError` naming it). The geometry travels in the one geometry codec of spec/geometry.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvspec.spec.geometry import Geometry, decode_geometry_input, encode_geometry_input

# the implementation's store rules (engine.STORE_RULES), its own vocabulary: a rule set's store field maps to one
STORE_PR53324 = "prompt-tail"  # PR #53324's: T = ⌊P/u⌋·u − e·u; a tail only off some Mamba block
STORE_VLLM = "checkpoint"  # vLLM's connector: checkpoint C, the partial tail to C + the proof margin

Obj = tuple[int, int]  # (group, boundary t)


class JobError(ValueError):
    """A job that does not decode: names the field."""


WRONG_LOADS = ("neighbour", "skip-mamba")  # FaultPlan.wrong_load's values


@attrs.frozen(kw_only=True)
class FaultPlan:
    """The faults one scenario injects into the rank pipeline, in the order they act; all off by default."""

    reput: bool = False  # the store path skips its existence check and puts keys that exist again

    evict_before_lookup: Mapping[int, tuple[str, ...]] = attrs.field(factory=dict)  # rank -> keys removed (forced)
    crash_after_store: int | None = None  # this rank SIGKILLs itself once its stores are done
    evict_after_lookup: Mapping[int, tuple[Obj, ...]] = attrs.field(factory=dict)  # rank -> objects removed
    evict_force: bool = True  # False: the lease the lookup's exist granted may refuse the removal
    evict_after_lookup_unforced: Mapping[int, tuple[Obj, ...]] = attrs.field(factory=dict)  # always force=False
    hold_before_load: str | None = None  # a directory: each rank writes ready<r> and waits for "go" before loading
    relookup: bool = False  # look up again after the load (what a retry would see)
    # the tiny model's loader broken on purpose (impl/model_worker.py): "neighbour" puts the previous block's object
    # into the last loaded target-attention block, "skip-mamba" starts from the initial Mamba state
    wrong_load: str | None = attrs.field(default=None, validator=attrs.validators.in_((None, *WRONG_LOADS)))

    @property
    def removed_after_lookup(self) -> dict[Obj, int]:
        """Return object -> the rank whose shard the plan removes between lookup and load (the unforced list aside:
        a lease may keep those)."""
        return {o: r for r, objs in self.evict_after_lookup.items() for o in objs}


@attrs.frozen(kw_only=True)
class ScenarioJob:
    """One scenario for the ranks: tokens from a seed, the stored requests, one lookup of `prompt` tokens."""

    seed: int
    prefix: str  # the scenario's key namespace (cache prefix)
    prompt: int
    rules: str  # the rule set's name, for reports only: what the engine does comes from the data fields below
    store_rule: str = STORE_PR53324  # engine.STORE_RULES: the rule set's store rule
    tail_at_hit: bool = False  # key the tail block at the hit (the legacy loader), else where it was stored
    lookahead: int = 0  # hash lookahead λ on this geometry: keys name [0, t + λ)
    deferred_saves: bool = False  # boundaries whose hash waits for outputs are stored once the writer decoded them
    decode_states: bool = False  # save_decode_cache stores decode-phase Mamba states (retention 0 becomes L)
    stored: tuple[tuple[int, int, int, bool], ...] = ()  # (prompt, shared, decoded, save_decode_cache) per request
    writers: tuple[tuple[str, int, bool, bool], ...] = ()  # (store rule, λ, deferred saves, decode states) of each
    #                                                        stored request's engine (a mixed fleet); () = the job's own
    predicted_keys: Mapping[int, tuple[str, ...]] = attrs.field(factory=dict)  # rank -> the spec's store keys
    faults: FaultPlan = FaultPlan()


@attrs.frozen(kw_only=True)
class TransferPlan:
    """The transfer bench's iteration (impl/transfer_bench.py): one request of `tokens`, `repeats` timed rounds."""

    tokens: int
    mamba_width: int
    repeats: int


@attrs.frozen(kw_only=True)
class Job:
    """What every rank process of one run gets: the store, the model, the geometry, and what to run."""

    master: str
    geometry: Geometry
    model: str = "kvspec-model"
    width: int = 8  # int32 values per attention token row
    store_rule: str = STORE_PR53324  # of the command-driven entry points (a scenario names its own); engine.STORE_RULES
    lookahead: int = 0  # their hash lookahead λ (keys name [0, t + λ)); a scenario names its own
    segment_bytes: int = 64 << 20
    concurrency: int = 16  # the load worker's thread pool
    scenarios: tuple[ScenarioJob, ...] = ()
    transfer: TransferPlan | None = None


def _ranked(d: Mapping[int, Any], item: Any = list) -> dict[str, Any]:
    return {str(r): [item(x) for x in xs] for r, xs in d.items()}


def encode_job(job: Job) -> dict[str, Any]:
    """Return the JSON object of a job."""
    out: dict[str, Any] = {"master": job.master, "geometry": encode_geometry_input(job.geometry), "model": job.model,
                           "width": job.width, "store_rule": job.store_rule, "lookahead": job.lookahead,
                           "segment_bytes": job.segment_bytes,
                           "concurrency": job.concurrency, "scenarios": [_encode_scenario(s) for s in job.scenarios]}
    if job.transfer is not None:
        out["transfer"] = attrs.asdict(job.transfer)
    return out


def _encode_scenario(s: ScenarioJob) -> dict[str, Any]:
    f = s.faults
    return {"seed": s.seed, "prefix": s.prefix, "prompt": s.prompt, "rules": s.rules, "store_rule": s.store_rule,
            "tail_at_hit": s.tail_at_hit, "lookahead": s.lookahead, "deferred_saves": s.deferred_saves,
            "decode_states": s.decode_states,
            "stored": [list(r) for r in s.stored], "writers": [list(w) for w in s.writers],
            "predicted_keys": _ranked(s.predicted_keys, str),
            "faults": {"evict_before_lookup": _ranked(f.evict_before_lookup, str),
                       "crash_after_store": f.crash_after_store,
                       "evict_after_lookup": _ranked(f.evict_after_lookup),
                       "evict_force": f.evict_force,
                       "evict_after_lookup_unforced": _ranked(f.evict_after_lookup_unforced),
                       "hold_before_load": f.hold_before_load, "relookup": f.relookup, "reput": f.reput,
                       "wrong_load": f.wrong_load}}


def _fields(raw: Any, what: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise JobError(f"{what} must be a JSON object, got {type(raw).__name__}")
    missing, unknown = required - set(raw), set(raw) - required - optional
    if missing or unknown:
        raise JobError(f"{what}: " + "; ".join(([f"missing {', '.join(sorted(missing))}"] if missing else [])
                                               + ([f"unknown {', '.join(sorted(unknown))}"] if unknown else [])))
    return raw


def _decode_ranked(raw: Any, what: str, item: Any) -> dict[int, tuple[Any, ...]]:
    if not isinstance(raw, dict):
        raise JobError(f"{what} must map ranks to lists")
    return {int(r): tuple(item(x) for x in xs) for r, xs in raw.items()}


def _obj(x: Any) -> Obj:
    return int(x[0]), int(x[1])


def _decode_scenario(raw: Any, k: int) -> ScenarioJob:
    what = f"scenario {k}"
    d = _fields(raw, what, {"seed", "prefix", "prompt", "rules"},
                {"store_rule", "tail_at_hit", "lookahead", "deferred_saves", "decode_states", "stored", "writers",
                 "predicted_keys", "faults"})
    fr = _fields(d.get("faults", {}), f"{what} faults", set(), set(attrs.fields_dict(FaultPlan)))
    if fr.get("wrong_load") not in (None, *WRONG_LOADS):
        raise JobError(f"{what} faults: wrong_load must be one of {', '.join(WRONG_LOADS)}, got {fr['wrong_load']!r}")
    faults = FaultPlan(
        evict_before_lookup=_decode_ranked(fr.get("evict_before_lookup", {}), "evict_before_lookup", str),
        crash_after_store=fr.get("crash_after_store"),
        evict_after_lookup=_decode_ranked(fr.get("evict_after_lookup", {}), "evict_after_lookup", _obj),
        evict_force=bool(fr.get("evict_force", True)),
        evict_after_lookup_unforced=_decode_ranked(fr.get("evict_after_lookup_unforced", {}),
                                                   "evict_after_lookup_unforced", _obj),
        hold_before_load=fr.get("hold_before_load"), relookup=bool(fr.get("relookup", False)),
        reput=bool(fr.get("reput", False)), wrong_load=fr.get("wrong_load"))
    return ScenarioJob(seed=int(d["seed"]), prefix=str(d["prefix"]), prompt=int(d["prompt"]), rules=str(d["rules"]),
                       store_rule=str(d.get("store_rule", STORE_PR53324)), tail_at_hit=bool(d.get("tail_at_hit", False)),
                       lookahead=int(d.get("lookahead", 0)),
                       deferred_saves=bool(d.get("deferred_saves", False)),
                       decode_states=bool(d.get("decode_states", False)),
                       stored=tuple((int(p), int(s), int(o), bool(c)) for p, s, o, c in d.get("stored", [])),
                       writers=tuple((str(r), int(la), bool(df), bool(ds)) for r, la, df, ds in d.get("writers", [])),
                       predicted_keys=_decode_ranked(d.get("predicted_keys", {}), "predicted_keys", str),
                       faults=faults)


def decode_job(raw: Any) -> Job:
    """Return the Job of a JSON object; JobError naming the field otherwise."""
    d = _fields(raw, "job", {"master", "geometry"},
                {"model", "width", "store_rule", "lookahead", "segment_bytes", "concurrency", "scenarios", "transfer"})
    transfer = None
    if d.get("transfer") is not None:
        t = _fields(d["transfer"], "transfer", set(attrs.fields_dict(TransferPlan)), set())
        transfer = TransferPlan(**{k: int(v) for k, v in t.items()})
    given: dict[str, Any] = {k: str(d[k]) for k in ("model", "store_rule") if k in d}
    given.update({k: int(d[k]) for k in ("width", "lookahead", "segment_bytes", "concurrency") if k in d})
    return Job(master=str(d["master"]), geometry=decode_geometry_input(d["geometry"]), **given,
               scenarios=tuple(_decode_scenario(s, k) for k, s in enumerate(d.get("scenarios", []))),
               transfer=transfer)
