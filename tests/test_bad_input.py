"""Bad input, fuzzed: exit code 2 and one line naming the rule, never a traceback (issue 5.4)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.checks.cli.main import main
from kvspec.spec.errors import SpecError
from kvspec.spec.scenario import decode_scenario

ONE_LINE = re.compile(r"^kvspec: error: [a-z0-9-]+: .+$")
json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**7) | st.floats(allow_nan=False)
                           | st.text(max_size=6), lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)
flag_values = st.one_of(st.integers(-5, 10**6).map(str), st.sampled_from(["x", "", "1e3", "-0", "3.5", "@", "%",
                                                                          "legacy", "pr53324", "vllm-0.33.0"]))
flags = st.sampled_from(["--dcp", "--unit", "--group", "--retention", "--stored-prompt", "--prompt", "--shared",
                         "--preset", "--stored-json", "--rules"])


def run_cli(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(flags, flag_values), max_size=6), st.sampled_from([[], ["--json"], ["--legacy-tail-key"],
                                                                            ["--rules", "pr53324"]]))
def test_fuzzed_flags(capsys, pairs, extra):
    argv = ["explain", *[x for p in pairs for x in p], *extra]
    rc, out, err = run_cli(argv, capsys)
    if rc == 0:
        assert not err
    else:
        assert rc == 2 and len(err.strip().splitlines()) == 1 and ONE_LINE.match(err.strip()), err


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(json_values)
def test_fuzzed_stored_json(tmp_path_factory, capsys, value):
    f = tmp_path_factory.mktemp("j") / "stored.json"
    f.write_text(json.dumps(value))
    rc, out, err = run_cli(["explain", "--preset", "kimi-k3-dcp8", "--stored-json", str(f), "--prompt", "15000"],
                           capsys)
    assert rc in (0, 2)
    if rc == 2:
        assert ONE_LINE.match(err.strip()) and len(err.strip().splitlines()) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(json_values)
def test_fuzzed_scenario_objects_give_error_objects(value):
    try:
        decode_scenario(value)
    except SpecError as err:
        assert err.rule and err.message


def test_scenarios_file_with_garbage_lines(tmp_path):
    lines = ["", "[]", "null", '{"prompt": 5}', '{"groups": [], "prompt": 5, "stored_prompt": 5}',
             '{"groups": [{"kind": "mamba", "block_size": 4}], "prompt": 5, "stored_prompt": 5, "evil": 1}',
             "\u00ff\u00fe garbage", '{"groups": [{"kind": "mamba", "block_size": 4}], "unit": 4, "prompt": 9, "stored_prompt": 9}']
    f = tmp_path / "s.jsonl"
    f.write_text("\n".join(lines))
    p = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", "--scenarios", str(f)],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "Traceback" not in p.stderr
    res = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(res) == 7 and all(r["error"] for r in res[:-1]) and res[-1]["error"] is None


def test_missing_files_and_binary_input(tmp_path, capsys):
    rc, _, err = run_cli(["explain", "--preset", "kimi-k3-dcp8", "--stored-json", str(tmp_path / "nope"),
                          "--prompt", "5"], capsys)
    assert rc == 2 and err.startswith("kvspec: error: input-file:")
    b = tmp_path / "bin"
    b.write_bytes(b"\xff\xfe\x00\x01")
    rc, _, err = run_cli(["explain", "--preset", "kimi-k3-dcp8", "--stored-json", str(b), "--prompt", "5"], capsys)
    assert rc == 2 and err.startswith("kvspec: error: input-encoding:")
    rc, _, err = run_cli(["explain", "--scenarios", str(tmp_path / "nope")], capsys)
    assert rc == 2 and err.startswith("kvspec: error: input-file:")


def test_cli_subprocess_never_tracebacks():
    for argv in (["explain", "--dcp", "-1", "--group", "attention:4", "--prompt", "3", "--stored-prompt", "3"],
                 ["explain", "--group", "attention:4:eagle:x", "--prompt", "3", "--stored-prompt", "3"],
                 ["explain", "--unit", "0", "--group", "mamba:4", "--prompt", "3", "--stored-prompt", "3"]):
        p = subprocess.run([sys.executable, "-m", "kvspec.checks", *argv], capture_output=True, text=True)
        assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("model,prefix", [("a@b", ""), ("a", "b@"), ("a%40b", ""), ("", "x"), ("a@tp_rank:0", "p")])
def test_adversarial_key_fields_cannot_collide(model, prefix):
    from kvspec.spec.keys import StoreKey, parse_key, render_key
    k = StoreKey(model=model, tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex="ab",
                 cache_prefix=prefix)
    assert parse_key(render_key(k)) == k


GOOD_LINE = b'{"groups": [{"kind": "mamba", "block_size": 4}], "unit": 4, "prompt": 9, "stored_prompt": 9}'


def test_hostile_json_regressions(tmp_path):
    """Deep nesting, non-UTF-8 bytes, digit-limit integers and endless input: one named error, the rest answered."""
    deep = b'{"a": ' + b"[" * 100_000 + b"1" + b"]" * 100_000 + b"}"
    f = tmp_path / "deep.json"
    f.write_bytes(deep)
    p = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", "--preset", "kimi-k3-dcp8", "--prompt",
                        "15000", "--stored-json", str(f)], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2 and p.stderr.strip() == f"kvspec: error: input-depth: {f} nests JSON too deeply"
    lines = tmp_path / "s.jsonl"
    lines.write_bytes(b"\n".join([GOOD_LINE, b"\xff\xfe not utf-8", deep, b'{"prompt": ' + b"9" * 5000 + b"}",
                                  GOOD_LINE]) + b"\n")
    p = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", "--scenarios", str(lines)],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 0 and "Traceback" not in p.stderr
    res = [json.loads(x) for x in p.stdout.splitlines()]
    assert [r["error"]["rule"] if r["error"] else None for r in res] == \
        [None, "input-encoding", "input-depth", "scenario-json", None]
    for args in (["--preset", "kimi-k3-dcp8", "--prompt", "15000", "--stored-json", "/dev/zero"],
                 ["--scenarios", "/dev/zero"]):
        p = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", *args], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2 and "Traceback" not in p.stderr and "input-size" in (p.stderr + p.stdout)
