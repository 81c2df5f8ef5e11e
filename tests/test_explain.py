"""The worked example of PR #53324 and the `kvspec explain` contract."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hypothesis import given

from kvspec.checks.cli.main import main

from .support.strategies import scenarios

SHIPPED = ["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "15000", "--prompt", "15000"]
EXAMPLE = [*SHIPPED, "--rules", "pr53324"]


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def by_group(items, g):
    return [x["boundary"] for x in items if x["group"] == g]


def test_worked_example(capsys):
    d = run_json(capsys, *EXAMPLE)
    assert d["geometry"]["lcm_span"] == 12288 and d["geometry"]["fine"] is True
    assert [g["span"] for g in d["geometry"]["groups"]] == [12288, 1536]
    assert by_group(d["stored"], 0) == [12288, 14848] and by_group(d["stored"], 1) == [13824, 14848]
    assert d["hit_length"] == 13824
    assert d["tail_boundaries"] == [{"group": 0, "boundary": 14848}, {"group": 1, "boundary": 13824}]
    assert [(e["group"], e["block"], e["key_boundary"], e["present"]) for e in d["load"]] == \
        [(0, 0, 12288, True), (0, 1, 14848, True), (1, 8, 13824, True)]
    assert [(e["start"], e["end"]) for e in d["load"]] == [(0, 12288), (12288, 13824), (12288, 13824)]
    assert d["error"] is None


def test_worked_example_newest_release_is_the_default(capsys):
    """vLLM 0.34.0 (the default): lookahead keys, no EAGLE drop, checkpoint 14976, hit 14976."""
    d = run_json(capsys, *SHIPPED)
    assert d["rules"] == "vllm-0.34.0"
    assert by_group(d["stored"], 0) == [12288, 14976] and by_group(d["stored"], 1) == [13824, 14976]
    assert d["hit_length"] == 14976
    assert d["tail_boundaries"] == [{"group": 0, "boundary": 14976}, {"group": 1, "boundary": 14976}]


def test_worked_example_vllm_0_33_0(capsys):
    d = run_json(capsys, *SHIPPED, "--rules", "vllm-0.33.0")
    assert d["rules"] == "vllm-0.33.0"
    # 0.33.0 publishes the attention tail up to the checkpoint 14848 plus the EAGLE proof margin (one unit)
    assert by_group(d["stored"], 0) == [12288, 14976] and by_group(d["stored"], 1) == [14848]
    assert d["hit_length"] == 14848
    assert d["tail_boundaries"] == [{"group": 0, "boundary": 14976}, {"group": 1, "boundary": 14848}]
    assert [(e["group"], e["block"], e["key_boundary"], e["present"]) for e in d["load"]] == \
        [(0, 0, 12288, True), (0, 1, 14976, True), (1, 9, 14848, True)]


def test_legacy_tail_key_is_an_alias_of_rules_legacy(capsys):
    a = run_json(capsys, *SHIPPED, "--legacy-tail-key")
    b = run_json(capsys, *SHIPPED, "--rules", "legacy")
    assert a == b and a["rules"] == "legacy"
    with pytest.raises(SystemExit) as ei:
        main([*SHIPPED, "--legacy-tail-key", "--rules", "pr53324"])
    assert ei.value.code == 2


def test_worked_example_legacy(capsys):
    d = run_json(capsys, *EXAMPLE[:-2], "--legacy-tail-key")
    assert d["hit_length"] == 13824
    tail = d["load"][1]
    assert (tail["group"], tail["block"], tail["key_boundary"], tail["present"]) == (0, 1, 13824, False)


def test_worked_example_with_draft_group(capsys):
    d = run_json(capsys, "explain", "--dcp", "8", "--unit", "128", "--group", "attention:1536",
                 "--group", "attention:1536:eagle", "--group", "mamba:1536", "--stored-prompt", "15000",
                 "--prompt", "15000", "--rules", "pr53324")
    assert d["hit_length"] == 13824
    assert d["tail_boundaries"] == [{"group": 0, "boundary": 14848}, {"group": 1, "boundary": 14848},
                                    {"group": 2, "boundary": 13824}]


def test_table_output(capsys):
    assert main(EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "hit length: 13824" in out and "eagle-drop -> 14720" in out and "-> 13824" in out


def test_stored_json(tmp_path, capsys):
    f = tmp_path / "e.json"
    f.write_text(json.dumps([{"group": 0, "boundary": 12288}, {"group": 0, "boundary": 14848},
                             {"group": 1, "boundary": 13824}]))
    d = run_json(capsys, "explain", "--preset", "kimi-k3-dcp8", "--stored-json", str(f), "--prompt", "15000")
    assert d["hit_length"] == 13824 and d["tail_boundaries"][0]["boundary"] == 14848


@pytest.mark.parametrize("argv,rule", [
    (["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "15000", "--prompt", "0"], "scenario"),
    (["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "15000"], "scenario"),
    (["explain", "--group", "mamba:1000", "--unit", "128", "--stored-prompt", "5", "--prompt", "5"],
     "unit-divides-span"),
    (["explain", "--group", "lstm:4", "--stored-prompt", "5", "--prompt", "5"], "group-kind"),
    (["explain", "--group", "mamba", "--stored-prompt", "5", "--prompt", "5"], "group-syntax"),
    (["explain", "--group", "attention:4", "--group", "mamba:4", "--dcp", "0", "--stored-prompt", "5",
      "--prompt", "5"], "dcp-positive"),
    (["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "100", "--prompt", "200", "--shared", "150"],
     "scenario"),
    (["explain", "--preset", "nope"], "cli-usage"),
    (["explain", "--prompt", "x"], "cli-usage"),
    (["frobnicate"], "cli-usage"),
])
def test_invalid_input_exits_2_with_one_line(argv, rule, capsys):
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvspec: error: {rule}:"), err


def test_bad_stored_json(tmp_path, capsys):
    for content, rule in [("{", "stored-json"), ('[{"group": 0}]', "stored-object"),
                          ('[{"group": 5, "boundary": 128}]', "stored-object"),
                          ('[{"group": 0, "boundary": 100}]', "stored-object"),
                          ('[{"group": 0, "boundary": 99999}]', "stored-object")]:
        f = tmp_path / "bad.json"
        f.write_text(content)
        with pytest.raises(SystemExit) as ei:
            main(["explain", "--preset", "kimi-k3-dcp8", "--stored-json", str(f), "--prompt", "15000"])
        assert ei.value.code == 2
        assert capsys.readouterr().err.startswith(f"kvspec: error: {rule}:")


def test_scenarios_file_in_order_with_errors_and_fast(tmp_path):
    good = {"dcp": 8, "unit": 128, "groups": [{"kind": "attention", "block_size": 1536, "eagle": True},
                                              {"kind": "mamba", "block_size": 1536}],
            "retention": "replay", "stored_prompt": 15000, "prompt": 15000}
    lines = []
    for i in range(3000):
        if i % 1000 == 7:
            lines.append("{not json")
        elif i % 1000 == 8:
            lines.append(json.dumps({**good, "unit": 1000}))
        else:
            lines.append(json.dumps({**good, "legacy": bool(i % 2), "prompt": 13000 + i}))
    f = tmp_path / "s.jsonl"
    f.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", "--scenarios", str(f)],
                       capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - t0
    res = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(res) == 3000
    assert res[7]["error"]["rule"] == "scenario-json" and res[8]["error"]["rule"] == "unit-divides-span"
    assert res[2000]["error"] is None and res[2000]["geometry"]["dcp"] == 8
    print(f"3000 scenarios in {elapsed:.2f} s")
    assert elapsed < 30  # generous bound for a loaded CI box; the measured rate is printed


def test_explain_answers_under_a_second():
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvspec.checks", *EXAMPLE], check=True, capture_output=True)
    assert time.perf_counter() - t0 < 5  # measured ~0.1 s; bound loose for CI noise


@given(scenarios())
def test_scenario_codec_round_trip(sc):
    """encode_scenario is the one JSON form of a scenario: it decodes back equal, and the output echoes it."""
    from kvspec.spec.scenario import decode_scenario, encode_outcome, encode_scenario, evaluate_scenario
    raw = encode_scenario(sc)
    assert decode_scenario(json.loads(json.dumps(raw))) == sc
    assert encode_outcome(sc, evaluate_scenario(sc))["input"] == raw
