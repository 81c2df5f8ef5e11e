"""Mixed fleets (issue 28): writers and the reader run different rule sets against one store. A writer's objects show
only to a reader hashing with the same λ (spec/scenario.py compute_writer_lookahead): vLLM's keys carry no λ marker, so
0.33.0 and 0.34.0 EAGLE engines miss each other's objects, while engines without an EAGLE-family drafter share all."""

from __future__ import annotations

import itertools
import json
import random

import attrs
import pytest

from kvspec.checks.cli.main import main
from kvspec.spec.content import compute_wrong_positions
from kvspec.spec.errors import SpecError
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import (
    Scenario,
    StoredRequest,
    compute_stored,
    compute_writer_lookahead,
    decode_scenario,
    encode_scenario,
    evaluate_scenario,
)

V33, V34 = "vllm-0.33.0", "vllm-0.34.0"
KIMI = get_preset("kimi-k3-dcp8")
KIMI_PLAIN = attrs.evolve(KIMI, groups=tuple(attrs.evolve(g, eagle=False) for g in KIMI.groups))
# Kimi-K3 at DCP 8, an identical 15,000-token resend: (geometry, writer, reader) -> hit. The README's table.
FLEET = {
    ("eagle", V33, V33): 14848, ("eagle", V33, V34): 0, ("eagle", V34, V33): 0, ("eagle", V34, V34): 14976,
    ("plain", V33, V33): 14976, ("plain", V33, V34): 14976, ("plain", V34, V33): 14976, ("plain", V34, V34): 14976,
}


@pytest.mark.parametrize("case", sorted(FLEET))
def test_mixed_fleet_table(case):
    kind, writer, reader = case
    g = KIMI if kind == "eagle" else KIMI_PLAIN
    sc = Scenario(geometry=g, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000, rules=writer),),
                  rules=reader)
    out = evaluate_scenario(sc)
    assert out.hit_length == FLEET[case]
    assert all(e.present for e in out.load)


def test_a_writer_with_the_readers_rules_is_the_same_fleet():
    """rules = the reader's own rule set changes nothing; a writer of the other λ adds nothing to E."""
    same = Scenario(geometry=KIMI, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000),), rules=V34)
    named = attrs.evolve(same, stored=(StoredRequest(prompt=15000, shared=15000, rules=V34),))
    both = attrs.evolve(same, stored=(StoredRequest(prompt=15000, shared=15000, rules=V33),
                                      StoredRequest(prompt=15000, shared=15000)))
    assert evaluate_scenario(named).present == evaluate_scenario(same).present == evaluate_scenario(both).present


def test_every_load_key_is_stored_in_any_fleet():
    """On every small scenario of make verify's scope (one in 21), each writer under each vLLM-family rule set and the
    reader under each: every planned load key is present, and no mix loads a byte the same-λ fleet would not (the
    content check names no position that the reader's own rule set with those writers' objects would not)."""
    from kvspec.checks.verify.exhaustive import iterate_all
    rng = random.Random(5)
    family = ("pr53324", V33, V34, "vllm-0.33.0-lookahead")
    n = 0
    for sc in iterate_all(dcps=(1, 2, 4), every=21):
        if not sc.stored:
            continue
        reader = rng.choice(family)
        writers = tuple(attrs.evolve(r, rules=rng.choice(family)) for r in sc.stored)
        try:
            mixed = Scenario(geometry=sc.geometry, prompt=sc.prompt, stored=writers, evicted=sc.evicted, rules=reader)
        except SpecError:
            continue  # a rule set refuses the geometry (vLLM's u = span of a lone group)
        out = evaluate_scenario(mixed)
        assert all(e.present for e in out.load), mixed
        # the writers hashing with another λ leave E and the loaded bytes as if they had never written
        seen = tuple(r for r in writers if compute_writer_lookahead(mixed.geometry, mixed.rules, r) is not None)
        if seen:
            alone = attrs.evolve(mixed, stored=seen)
            assert compute_wrong_positions(mixed, out) == compute_wrong_positions(alone, evaluate_scenario(alone))
        else:
            assert out.hit_length == 0
        n += 1
    assert n > 1000


def test_compact_equals_explicit_for_a_mixed_fleet():
    """The compact path (runs and points) states the same visibility rule as the explicit one."""
    for geo, reader in itertools.product((KIMI, KIMI_PLAIN), (V33, V34)):
        sc = Scenario(geometry=geo, prompt=40000, stored=(StoredRequest(prompt=30000, shared=20000, rules=V33),
                                                         StoredRequest(prompt=40000, shared=35000, rules=V34)),
                      rules=reader)
        assert set(compute_stored(sc, compact=True)) == set(compute_stored(sc, compact=False))


def _explain_json(raw):
    """Return `kvspec explain --scenarios` output for one scenario (its result echoes the input)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", "--scenarios", "-"], input=json.dumps(raw),
                          capture_output=True, text=True, check=True)
    return done.stdout


def test_explain_says_which_writer_the_reader_cannot_see(capsys):
    assert main(["explain", "--preset", "kimi-k3-dcp8", "--stored", "15000:15000:vllm-0.33.0", "--stored", "15000:15000",
                 "--prompt", "15000"]) == 0
    out = capsys.readouterr().out
    assert "stored request 0 (15000 tokens) written under vllm-0.33.0 (λ = 0): the reader hashes with λ = 1" in out
    assert "stored request 1" not in out and "hit length: 14976" in out


def test_json_codec_schema_and_cli():
    """A writer's rule set travels in the scenario JSON (`requests[].rules`, schema-valid), and on the command line as
    --stored P:S:RULES (or P:RULES); an unknown name is exit 2 naming the rule."""
    from .test_vectors import validator
    sc = Scenario(geometry=KIMI, prompt=15000, stored=(StoredRequest(prompt=15000, shared=15000, rules=V33),),
                  rules=V34)
    raw = encode_scenario(sc)
    assert raw["requests"] == [{"prompt": 15000, "shared": 15000, "rules": V33}]
    assert decode_scenario(json.loads(json.dumps(raw))) == sc
    validator("scenario.schema.json").validate(raw)
    validator("outcome.schema.json").validate(json.loads(_explain_json(raw)))
    with pytest.raises(SpecError) as exc:
        decode_scenario({**raw, "requests": [{"prompt": 5, "shared": 5, "rules": 7}]})
    assert exc.value.rule == "scenario"
    assert main(["explain", "--preset", "kimi-k3-dcp8", "--stored", "15000:15000:vllm-0.33.0", "--prompt", "15000",
                 "--json"]) == 0
    assert main(["explain", "--preset", "kimi-k3-dcp8", "--stored", "15000:vllm-0.34.0", "--prompt", "15000",
                 "--check"]) == 0
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--preset", "kimi-k3-dcp8", "--stored", "15000:15000:vllm-9", "--prompt", "15000"])
    assert exit_.value.code == 2
