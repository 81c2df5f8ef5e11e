"""The CLI's contract: help text on every option, --version, exclusive flags refused, JSON errors with --json,
--check, kind aliases; and the package's library surface (__version__, __all__, py.typed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvspec
import kvspec.spec
from kvspec.checks.cli.main import build_parser

from .support.cli import run_cli

run = run_cli  # (argv, capsys) -> (exit status, stdout, stderr)


def test_every_explain_option_has_help():
    explain = build_parser()._subparsers._group_actions[0].choices["explain"]
    bare = [a.option_strings for a in explain._actions
            if a.option_strings and a.option_strings != ["-h", "--help"] and not a.help]
    assert bare == []
    assert "kimi-k3-dcp8" in explain.epilog and "exit status" in explain.epilog


def test_version(capsys):
    rc, out, _ = run(["--version"], capsys)
    assert rc == 0 and out.strip() == f"kvspec {kvspec.__version__}" and kvspec.__version__ != "0+unknown"


@pytest.mark.parametrize("argv,rule", [
    (["explain", "--preset", "tiny-dcp2", "--prompt", "9", "--stored-prompt", "9", "--stored-json", "x"], "cli-usage"),
    (["explain", "--preset", "tiny-dcp2", "--prompt", "9", "--rules", "pr53324", "--legacy-tail-key"], "cli-usage"),
    (["explain", "--scenarios", "-", "--prompt", "9"], "cli-usage"),
])
def test_excluding_flags_are_refused(argv, rule, capsys):
    rc, _, err = run(argv, capsys)
    assert rc == 2 and err.startswith(f"kvspec: error: {rule}:")


def test_json_errors_on_stdout(capsys):
    rc, out, err = run(["explain", "--preset", "tiny-dcp2", "--prompt", "0", "--stored-prompt", "1", "--json"], capsys)
    assert rc == 2 and json.loads(out)["error"]["rule"] == "scenario" and err.startswith("kvspec: error: scenario:")
    rc, out, _ = run(["explain", "--bogus", "--json"], capsys)  # a usage error too
    assert rc == 2 and json.loads(out)["error"]["rule"] == "cli-usage"


def test_check_exits_1_on_a_missing_load_key(capsys, tmp_path):
    legacy = ["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "15000", "--prompt", "15000"]
    assert run([*legacy, "--rules", "legacy", "--check"], capsys)[0] == 1  # the -704 of #53324
    assert run([*legacy, "--rules", "legacy"], capsys)[0] == 0  # without --check: an answer, exit 0
    assert run([*legacy, "--check"], capsys)[0] == 0  # the shipped rules load only stored keys
    f = tmp_path / "s.jsonl"
    f.write_text(json.dumps({"groups": [{"kind": "attention", "block_size": 4}], "prompt": 9, "stored_prompt": 9})
                 + "\n" + json.dumps({"groups": [], "prompt": 9, "stored_prompt": 9}) + "\n")
    assert run(["explain", "--scenarios", str(f)], capsys)[0] == 0
    assert run(["explain", "--scenarios", str(f), "--check"], capsys)[0] == 1  # the second line fails


def test_kind_aliases(capsys):
    rc, out, _ = run(["explain", "--group", "mla:16:eagle", "--group", "kda:16", "--unit", "4", "--dcp", "2",
                      "--stored-prompt", "57", "--prompt", "57", "--json"], capsys)
    same = run(["explain", "--group", "attention:16:eagle", "--group", "mamba:16", "--unit", "4", "--dcp", "2",
                "--stored-prompt", "57", "--prompt", "57", "--json"], capsys)
    assert rc == 0 and json.loads(out) == json.loads(same[1])
    assert [g["kind"] for g in json.loads(out)["geometry"]["groups"]] == ["attention", "mamba"]


def test_library_surface():
    assert set(kvspec.spec.__all__) <= set(dir(kvspec.spec))
    assert {"Scenario", "evaluate_scenario", "Geometry", "get_rules", "compute_lookup"} <= set(kvspec.spec.__all__)
    assert (Path(kvspec.__file__).parent / "py.typed").exists()
    assert "Apache License" in (Path(kvspec.__file__).parent.parent / "LICENSE").read_text()


def test_input_parity_flags(capsys):
    """--stored P[:S[:RULES]] (repeatable), --evict G:T[:R], --interleave, --pcp say what scenario JSON can say."""
    rc, out, _ = run(["explain", "--preset", "small-dcp2", "--prompt", "57", "--stored", "57", "--stored", "80:40",
                      "--evict", "1:52:1", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["input"]["requests"] == [{"prompt": 57, "shared": 57}, {"prompt": 80, "shared": 40}]
    assert d["input"]["evicted"] == [{"group": 1, "boundary": 52, "rank": 1}]
    from kvspec.spec.scenario import decode_scenario, encode_outcome, evaluate_scenario
    sc = decode_scenario(d["input"])  # the flags and the JSON form give the same scenario and result
    got = encode_outcome(sc, evaluate_scenario(sc))
    assert got == d
    rc, out, _ = run(["explain", "--group", "attention:8", "--dcp", "2", "--interleave", "4", "--prompt", "40",
                      "--stored", "40", "--rules", "pr53324", "--json"], capsys)
    assert rc == 0 and json.loads(out)["input"]["interleave"] == 4
    rc, _, err = run(["explain", "--preset", "small-dcp2", "--prompt", "57", "--stored", "57:x"], capsys)
    assert rc == 2 and "--stored takes P[+O][:S[:RULES]]" in err and "'x' is not a rule set" in err
    rc, _, err = run(["explain", "--preset", "small-dcp2", "--prompt", "57", "--stored", "57", "--stored-prompt", "5"],
                     capsys)
    assert rc == 2


def test_why_line_names_the_capping_group(capsys):
    rc, out, _ = run(["explain", "--preset", "small-dcp2", "--prompt", "57", "--stored", "57", "--evict", "1:52",
                      "--rules", "vllm-0.33.0"], capsys)
    assert rc == 0 and "why: hit 0: spec group [1] (mamba)" in out and "evicted there: [52]" in out
    rc, out, _ = run(["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "1000000", "--prompt", "1000000",
                      "--rules", "pr53324"], capsys)
    assert "why: hit 0: spec group [1] (mamba) accepts only 0 of the 999680" in out


def test_ranks_view_follows_the_ownership_rule(capsys):
    """--ranks: each rank's slots as the DCP ownership rule places them (interleave honoured), its keys, presence."""
    import re

    from kvspec.spec.ownership import compute_rank_positions
    rc, out, _ = run(["explain", "--group", "attention:8", "--dcp", "2", "--interleave", "2", "--stored", "40",
                      "--prompt", "40", "--rules", "pr53324", "--ranks"], capsys)
    assert rc == 0
    rows = re.findall(r"rank (\d+):|group 0 block (\d+): slots hold runs of (\d+) token\(s\) from (\d+), every (\d+), "
                      r"within \[(\d+), (\d+)\)", out)
    rank, seen = None, 0
    for r, blk, run_len, first, every, lo, hi in rows:
        if r:
            rank = int(r)
            continue
        want = compute_rank_positions(int(blk), 16, 2, 2, rank)
        got = [p for p in range(int(lo), int(hi)) if (p - int(first)) % int(every) < int(run_len) and p >= int(first)]
        assert tuple(got) == want
        seen += 1
    assert seen == 2 * 2  # two planned blocks on each of two ranks
    legacy = run(["explain", "--preset", "small-dcp2", "--stored-prompt", "57", "--prompt", "57", "--rules", "legacy",
                  "--ranks"], capsys)[1]
    assert legacy.count("@H_48: MISSING on this rank (-704)") == 2  # the #53324 key, on both ranks


def test_svg_picture_marks_missing_loaded_and_hit(tmp_path, capsys):
    """--svg draws one block per (group, rank, block), coloured by the plan; parsed back as XML."""
    import xml.etree.ElementTree as ET
    f = tmp_path / "legacy.svg"
    assert run(["explain", "--preset", "small-dcp2", "--stored-prompt", "57", "--prompt", "57", "--rules", "legacy",
                "--svg", str(f)], capsys)[0] == 0
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(f).getroot()
    blocks = [r for r in root.iterfind(".//s:rect", ns) if "block" in r.get("class", "")]
    state = {(int(r.get("data-group")), int(r.get("data-rank")), int(r.get("data-block"))): r.get("class").split()[1]
             for r in blocks}
    assert len(state) == 2 * 2 + 2 * 4  # attention: 2 blocks of 32 tokens, Mamba: 4 of 16, on each of 2 ranks
    assert state[(0, 0, 1)] == state[(0, 1, 1)] == "missing"  # H_48 was never stored: the #53324 -704
    assert state[(0, 0, 0)] == "loaded" and state[(1, 1, 2)] == "loaded" and state[(1, 0, 3)] == "stored"
    hit = root.find(".//s:line[@class='hit']", ns)
    assert hit is not None and "h = 48" in hit.find("s:title", ns).text
    assert len(root.findall(".//s:path[@class='tail']", ns)) == 4  # B_g on every (group, rank) row
    texts = [t.text for t in root.iterfind(".//s:text", ns)]
    assert "group 0 attention (EAGLE) rank 1" in texts and "group 1 mamba rank 0" in texts  # labels whole
    width = float(root.get("width"))
    assert all(float(r.get("x")) + float(r.get("width")) <= width for r in blocks)
    assert {"0", "10", "20", "30", "40", "50"} <= set(texts) and "tokens" in texts  # a token axis
    legend = " ".join(t for t in texts if t)
    assert all(w in legend for w in ("loaded", "-704", "stored, not loaded", "absent", "tail key", "hit length"))
    rc, _, err = run(["explain", "--preset", "small-dcp2", "--stored-prompt", "57", "--prompt", "57",
                      "--svg", str(tmp_path / "no" / "dir.svg")], capsys)
    assert rc == 2 and "output-file" in err


def test_bare_kvspec_prints_a_usage_line(capsys):
    rc, _, err = run([], capsys)
    assert rc == 2 and err.startswith("kvspec: error: cli-usage: give a command") and "usage: kvspec" in err


@pytest.mark.parametrize("argv", [
    ["explain", "--preset", "tiny-dcp2", "--prompt", "9", "--stored-prompt", "9", "--ranks", "--json"],
    ["explain", "--scenarios", "-", "--svg", "x.svg"],
    ["vectors", "--out", "x", "--check", "--force"],
    ["verify", "--list", "--json"],
    ["verify", "--fast", "--full"],
    ["bench", "--efficiency-only", "--dcp", "2"],
    ["bench", "--transfer-only", "--plot", "x.png"],
    ["conform", "vllm", "--examples", "5"],
    ["conform", "--adapter", "kvspec.checks.conform.adapters:IMPL", "--count", "5"],
])
def test_a_flag_the_mode_does_not_read_is_an_error(argv, capsys):
    """Every mode refuses the flags it would ignore (exit 2, naming them), instead of running without them."""
    rc, _, err = run(argv, capsys)
    assert rc == 2 and err.startswith("kvspec: error: cli-usage:"), err


def test_eagle_is_an_attention_flag(capsys):
    rc, _, err = run(["explain", "--group", "attention:4", "--group", "mamba:4:eagle", "--prompt", "8",
                      "--stored-prompt", "8"], capsys)
    assert rc == 2 and err.startswith("kvspec: error: eagle-attention:")


def test_vectors_out_never_deletes_a_foreign_file(tmp_path, capsys):
    """`vectors --out` writes to a new or empty folder, replaces a vectors tree only with --force, and refuses a
    folder holding anything else — the foreign file survives, with or without --force."""
    from kvspec.checks.output import replace_vectors_tree

    def fake(d):  # a one-case vectors tree (the real writer takes ~30 s; checks/output.py is what decides)
        case = d / "pr53324" / "explain" / "outcome" / "worked" / "c"
        case.mkdir(parents=True)
        (case / "meta.json").write_text('{"format": 1, "rules": "pr53324"}\n')
        (case / "input.json").write_text("{}\n")
        (case / "expected.json").write_text("{}\n")

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for force in (False, True):
        rc, _, err = run(["vectors", "--out", str(mine)] + (["--force"] if force else []), capsys)
        assert rc == 2 and "not test vectors (notes.txt)" in err
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    rc, _, err = run(["vectors", "--out", str(mine / "notes.txt")], capsys)
    assert rc == 2 and "not a folder" in err and (mine / "notes.txt").read_text() == "keep me"
    new = tmp_path / "new"
    replace_vectors_tree(new, fake)
    assert (new / "pr53324").is_dir()
    with pytest.raises(kvspec.spec.errors.SpecError, match="add --force"):
        replace_vectors_tree(new, fake)
    (new / "pr53324" / "stray.txt").write_text("x")
    with pytest.raises(kvspec.spec.errors.SpecError, match="not test vectors"):
        replace_vectors_tree(new, fake, force=True)
    (new / "pr53324" / "stray.txt").unlink()
    replace_vectors_tree(new, fake, force=True)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


def test_output_files_are_written_whole_or_refused(tmp_path, capsys):
    args = ["explain", "--preset", "tiny-dcp2", "--prompt", "9", "--stored-prompt", "9", "--svg"]
    rc, _, err = run([*args, str(tmp_path)], capsys)
    assert rc == 2 and "output-file" in err and "is a directory" in err
    rc, _, err = run([*args, str(tmp_path / "no" / "such" / "x.svg")], capsys)
    assert rc == 2 and "does not exist" in err
    rc, _, _ = run([*args, str(tmp_path / "x.svg")], capsys)
    assert rc == 0 and (tmp_path / "x.svg").read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.svg"]


def test_why_line_names_the_eagle_drop_when_it_is_the_cause(capsys):
    rc, out, _ = run(["explain", "--preset", "kimi-k3-dcp8", "--stored-prompt", "15000", "--prompt", "15000",
                      "--rules", "vllm-0.33.0"], capsys)
    why = next(line for line in out.splitlines() if line.startswith("why:"))
    assert rc == 0 and "the EAGLE drop: its blocks reach 14976" in why and "no block boundary chain" not in why
    rc, out, _ = run(["explain", "--group", "attention:4", "--group", "mamba:4", "--unit", "2", "--retention", "dense",
                      "--stored", "40:40", "--prompt", "40", "--evict", "1:40", "--evict", "1:38"], capsys)
    assert rc == 0 and "the last 4 of 9: [24, 28, 32, 36]; evicted there: [38, 40]" in out  # says what it cut
