"""The test vectors: every file valid against its JSON Schema, the committed tree exactly what this kvspec
generates (CI fails on any difference), and each explain case replayable through the scenario codec."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import given

from kvspec.spec.scenario import decode_scenario, encode_outcome, encode_scenario, evaluate_scenario

from .conftest import require
from .support.strategies import scenarios

ROOT = Path(__file__).parent.parent
VECTORS = ROOT / "vectors" / "cases"
SCHEMAS = ROOT / "schemas"
jsonschema = require("jsonschema")  # in requirements/cpu.lock: a skip here would hide a missing install
referencing = require("referencing")
jsonschema_rs = require("jsonschema_rs")  # the bulk check of every vector (below)


@functools.cache
def _schemas() -> dict[str, dict]:
    """Return every schema of schemas/ by file name."""
    return {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}


def validator(name: str):
    """Return a draft 2020-12 validator for one schema, resolving $refs to the others by their $id."""
    registry = referencing.Registry().with_resources(
        (doc["$id"], referencing.Resource.from_contents(doc)) for doc in _schemas().values())
    schema = _schemas()[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


SCHEMA_OF = {("explain", "input.json"): "scenario.schema.json", ("explain", "expected.json"): "outcome.schema.json",
             ("failure", "input.json"): "failure-input.schema.json",
             ("failure", "expected.json"): "failure-expected.schema.json",
             ("keys", "input.json"): "keys-input.schema.json", ("keys", "expected.json"): "keys-expected.schema.json"}


def fast_validator(name: str):
    """Return jsonschema-rs's draft 2020-12 validator for one schema, the others registered by their $id: the same
    standard as `validator`, compiled (the vector tree's 15,606 documents in 0.5 s instead of 18 s, measured)."""
    registry = jsonschema_rs.Registry([(doc["$id"], doc) for doc in _schemas().values()])
    return jsonschema_rs.Draft202012Validator(_schemas()[name], registry=registry)


def test_every_vector_file_matches_its_schema():
    names = {*SCHEMA_OF.values(), "vector-meta.schema.json"}
    for name in names:
        validator(name)  # each schema is itself a valid draft 2020-12 schema (the Python validator's check_schema)
    validators = {name: fast_validator(name) for name in names}
    n = 0
    for case in VECTORS.glob("*/*/*/*/*"):
        meta = json.loads((case / "meta.json").read_text())
        validators["vector-meta.schema.json"].validate(meta)
        assert case.relative_to(VECTORS).parts == (meta["rules"], meta["runner"], meta["handler"], meta["suite"],
                                                   meta["case"])
        for f in ("input.json", "expected.json"):
            validators[SCHEMA_OF[meta["runner"], f]].validate(json.loads((case / f).read_text()))
        n += 1
    assert n > 700


def test_both_validators_refuse_what_the_schemas_refuse():
    """The compiled validator is not vacuous: a field of the wrong type, a missing required field, a wrong object in
    a list and a wrong input behind the $ref to another schema fail under it as under the Python validator."""
    case = sorted(VECTORS.glob("pr53324/explain/outcome/*/*"))[0]
    good = json.loads((case / "expected.json").read_text())
    broken = [{**good, "hit_length": "x"}, {k: v for k, v in good.items() if k != "hit_length"},
              {**good, "stored": [{**good["stored"][0], "prompt": "seven"}]},
              {**good, "input": {"geometry": "nope"}}]  # the last through the $ref to scenario.schema.json
    slow, fast = validator("outcome.schema.json"), fast_validator("outcome.schema.json")
    for doc in [good, *broken]:
        assert (not list(slow.iter_errors(doc))) == fast.is_valid(doc) == (doc is good), sorted(doc)


def test_committed_vectors_are_what_kvspec_generates(tmp_path):
    from kvspec.checks.conform.vectors import compare_trees, write_vectors
    counts = write_vectors(tmp_path / "v")
    assert counts["legacy"] >= 3 and counts["pr53324"] > 300 and counts["vllm-0.33.0"] > 300
    assert counts["vllm-0.33.0-lookahead"] > 300
    assert compare_trees(tmp_path / "v", VECTORS) == []  # `make vectors` after a change to the rules


def test_explain_cases_replay_through_the_codec():
    for case in VECTORS.glob("*/explain/outcome/*/*"):
        sc = decode_scenario(json.loads((case / "input.json").read_text()))
        got = encode_outcome(sc, evaluate_scenario(sc))
        got.pop("input")
        assert got == json.loads((case / "expected.json").read_text()), case


def test_legacy_counterexample_has_a_missing_key():
    exp = json.loads((VECTORS / "legacy/explain/outcome/counterexample/kimi-k3-dcp8-15000/expected.json").read_text())
    assert [e["key_boundary"] for e in exp["load"] if not e["present"]] == [13824]


@given(scenarios())
def test_codec_output_matches_the_schemas(sc):
    out = encode_outcome(sc, evaluate_scenario(sc))
    validator("outcome.schema.json").validate(out)
    validator("scenario.schema.json").validate(encode_scenario(sc))


def test_schemas_reject_what_is_not_a_result():
    v = validator("outcome.schema.json")
    good = json.loads((VECTORS / "vllm-0.33.0/explain/outcome/worked/small-dcp2-57/expected.json").read_text())
    v.validate(good)
    for bad in ({**good, "hit_length": -1}, {**good, "extra": 1}, {k: x for k, x in good.items() if k != "load"},
                {**good, "load": [{**good["load"][0], "present": "yes"}]}):
        with pytest.raises(jsonschema.ValidationError):
            v.validate(bad)
    runs = {"group": 0, "runs": [[16, 16, 64]], "points": [70], "evicted": []}
    v.validate({**good, "form": "compact", "stored": [runs]})
    for item in ({"group": 0, "boundary": 0}, {**runs, "boundary": 16}, {**runs, "runs": [[16, 16]]}, 7):
        with pytest.raises(jsonschema.ValidationError):
            v.validate({**good, "stored": [item]})
    with pytest.raises(jsonschema.ValidationError):  # two ways of saying what was stored
        validator("scenario.schema.json").validate({"groups": [{"kind": "mamba", "block_size": 4}], "prompt": 4,
                                                     "stored_prompt": 4, "requests": []})


def test_key_vectors_replay_through_the_hash_chain():
    """A porter's check of its hashing: token ids -> H_t (or H'_t with lookahead) -> the key in both grammars."""
    from kvspec.spec.keys import KEY_GRAMMARS, StoreKey, compute_hash_at, compute_lookahead_chain
    seen = set()
    for case in VECTORS.glob("*/keys/render/*/*"):
        inp, exp = (json.loads((case / f).read_text()) for f in ("input.json", "expected.json"))
        lookahead = inp.get("lookahead", 0)
        chain = compute_lookahead_chain(inp["tokens"], inp["unit"], lookahead)
        h = compute_hash_at(chain, inp["unit"], inp["boundary"]).hex()
        assert h == exp["hash_hex"], case
        key = StoreKey(model=inp["model"], tp_rank=inp["tp_rank"], pcp_rank=inp["pcp_rank"], dcp_rank=inp["dcp_rank"],
                       pp_rank=inp["pp_rank"], group=inp["group"], hash_hex=h, cache_prefix=inp["cache_prefix"])
        assert all(exp[f"key_{n.replace('-', '_').replace('.', '_')}"] == r(key) for n, r in KEY_GRAMMARS.items())
        seen.add(lookahead)
    assert seen == {0, 1}


def test_the_schemas_name_every_rule_set():
    """A rule set added to spec/rules.py is a valid `rules` value of every schema that lists them."""
    from kvspec.spec.rules import DEFAULT_RULES, RULE_SETS
    for name in ("outcome.schema.json", "scenario.schema.json", "vector-meta.schema.json"):
        rules = json.loads((SCHEMAS / name).read_text())["properties"]["rules"]
        assert rules["enum"] == list(RULE_SETS), name
        assert rules.get("default", DEFAULT_RULES) == DEFAULT_RULES, name
