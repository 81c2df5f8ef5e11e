"""The drafter kind (issue 28): vLLM 0.34.0 hashes as far ahead as its drafter reads — one token for EAGLE, EAGLE3 and
MTP, K for K-module MTP (`num_prefill_lookahead_tokens`) — and DSpark / DFlash take neither the drop nor lookahead.
kvspec: `Geometry.draft_reach` (JSON `draft_reach`, `--drafter`), λ from it (spec/rules.py compute_lookahead), and the
content model's draft KV at p reading p + K."""

from __future__ import annotations

import json
import random

import attrs
import pytest

from kvspec.checks.cli.main import main
from kvspec.spec.content import compute_wrong_positions
from kvspec.spec.errors import SpecError
from kvspec.spec.geometry import Geometry, Group
from kvspec.spec.presets import get_preset
from kvspec.spec.rules import compute_lookahead, get_rules
from kvspec.spec.scenario import Scenario, StoredRequest, decode_scenario, encode_scenario, evaluate_scenario

KIMI = get_preset("kimi-k3-dcp8")


@pytest.mark.parametrize("rules, reach, want", [
    ("vllm-0.34.0", 1, 1), ("vllm-0.34.0", 3, 3), ("vllm-0.33.0", 3, 0), ("pr53324", 3, 0),
    ("vllm-0.33.0-lookahead", 3, 3), ("vllm-0.33.0-lookahead", 1, 1)])
def test_lambda_is_the_drafters_reach(rules, reach, want):
    assert compute_lookahead(get_rules(rules), attrs.evolve(KIMI, draft_reach=reach)) == want


def test_without_a_drafter_flag_no_reach():
    """A reach names an EAGLE-family drafter: without the flag it is refused by name; the bigram rule set of SGLang keeps
    its one-token bigram whatever the reach."""
    plain = attrs.evolve(KIMI, groups=tuple(attrs.evolve(g, eagle=False) for g in KIMI.groups))
    with pytest.raises(SpecError) as exc:
        attrs.evolve(plain, draft_reach=2)
    assert exc.value.rule == "draft-reach"
    g = Geometry(unit=16, groups=(Group(kind="attention", block_size=16, eagle=True),), draft_reach=4)
    assert compute_lookahead(get_rules("sglang-0.5.23"), g) == 1


def test_kimi_resend_with_three_module_mtp():
    """Kimi-K3, a 14,978-token resend: MTP (λ = 1) keeps the checkpoint at 14,976; 3-module MTP (λ = 3) hashes three
    tokens ahead, so only ⌊(14978 − 3)/128⌋·128 = 14,848 is hashed and stored; 0.33.0 (λ = 0, the drop) 14,848."""
    def hit(reach, rules):
        sc = Scenario(geometry=attrs.evolve(KIMI, draft_reach=reach), prompt=14978,
                      stored=(StoredRequest(prompt=14978, shared=14978),), rules=rules)
        return evaluate_scenario(sc).hit_length
    assert (hit(1, "vllm-0.34.0"), hit(3, "vllm-0.34.0"), hit(3, "vllm-0.33.0")) == (14976, 14848, 14848)


def test_lookahead_of_the_reach_loads_no_foreign_draft_row():
    """The content check with a 3-token drafter: two writers, the first ending inside the reader's hit. Hashing 3
    tokens ahead (0.34.0) loads no draft row that read another writer's tokens; the legacy hashes (0.33.0: λ = 0, one
    unit dropped) do, and so does a one-token key (SGLang's bigram, λ = 1, no drop) under that drafter — the key must
    name as many tokens as the drafter reads (CONTENT-KEY: λ ≥ the reach)."""
    rng = random.Random(3)
    bad = {"vllm-0.34.0": 0, "vllm-0.33.0": 0, "sglang-0.5.23": 0}
    for _ in range(300):
        u = rng.choice([1, 2])
        p1 = rng.randint(4, 40)
        stored = (StoredRequest(prompt=p1, shared=p1), StoredRequest(prompt=p1 + 20, shared=p1 + 20))
        hybrid = Geometry(unit=u, groups=(Group(kind="attention", block_size=u * rng.choice([1, 2]), eagle=True),
                                          Group(kind="mamba", block_size=u)), draft_reach=3)
        alone = Geometry(unit=u, groups=(Group(kind="attention", block_size=u, eagle=True),), draft_reach=3)
        for rules, g in (("vllm-0.34.0", hybrid), ("vllm-0.33.0", hybrid), ("sglang-0.5.23", alone)):
            sc = Scenario(geometry=g, prompt=p1 + 25, stored=stored, rules=rules)
            out = evaluate_scenario(sc)
            assert all(e.present for e in out.load)
            bad[rules] += bool(compute_wrong_positions(sc, out))
    assert bad["vllm-0.34.0"] == 0 and bad["vllm-0.33.0"] > 0 and bad["sglang-0.5.23"] > 0, bad


def test_codec_schema_and_cli(capsys):
    from .test_vectors import validator
    sc = Scenario(geometry=attrs.evolve(KIMI, draft_reach=3), prompt=14978,
                  stored=(StoredRequest(prompt=14978, shared=14978),))
    raw = encode_scenario(sc)
    assert raw["draft_reach"] == 3 and decode_scenario(json.loads(json.dumps(raw))) == sc
    validator("scenario.schema.json").validate(raw)
    assert "draft_reach" not in encode_scenario(attrs.evolve(sc, geometry=KIMI))  # the default is not written
    assert main(["explain", "--preset", "kimi-k3-dcp8", "--drafter", "mtp-multi:3", "--stored-prompt", "14978",
                 "--prompt", "14978"]) == 0
    out = capsys.readouterr().out
    assert "drafter reach 3 (λ = 3)" in out and "hit length: 14848" in out
    for argv, rule in ((["--drafter", "dspark"], "draft-reach"), (["--drafter", "mtp-multi"], "cli-usage"),
                       (["--drafter", "medusa"], "cli-usage")):
        with pytest.raises(SystemExit) as exc:
            main(["explain", "--preset", "kimi-k3-dcp8", *argv, "--stored-prompt", "100", "--prompt", "100"])
        assert exc.value.code == 2 and rule in capsys.readouterr().err
    assert main(["explain", "--group", "attention:16", "--group", "attention:16", "--group", "mamba:16", "--unit", "4",
                 "--drafter", "dspark", "--stored-prompt", "50", "--prompt", "50"]) == 0
    capsys.readouterr()
