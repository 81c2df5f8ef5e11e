"""Hostile input to `kvspec explain`: huge and odd numbers, deep or non-UTF-8 files, endless streams.

The contract (spec/limits.py, checks/cli/main.py): exit 0 with an answer, or exit 2 with one line naming the
rule; never a traceback, never a hang, never a memory blow-up; every answer within 2 s of CPU time.
A fuzz (thousands of in-process runs) plus a regression corpus of cases that once broke it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.checks.cli.main import main

ONE_LINE = re.compile(r"^kvspec: error: [a-z0-9-]+: .+$")
CPU_BUDGET_S = 2.0
CORPUS = Path(__file__).parent / "data" / "cli_regressions.txt"


def hostile_files(root: Path) -> dict[str, str]:
    """Write the hostile input files once; return name -> path."""
    files = {
        "deep": "[" * 200_000,
        "deep-obj": '{"a":' * 100_000 + "1" + "}" * 100_000,
        "bigint": '[{"group": 0, "boundary": ' + "9" * 5000 + "}]",
        "huge-line": json.dumps({"groups": [{"kind": "attention", "block_size": 16}], "prompt": 10**30,
                                 "stored_prompt": 10**30}),
        "many-groups": json.dumps({"groups": [{"kind": "mamba", "block_size": 4}] * 20_001, "prompt": 64,
                                   "stored_prompt": 64}),
        "big-dcp": json.dumps({"groups": [{"kind": "attention", "block_size": 16}], "dcp": 10**12, "prompt": 64,
                               "stored_prompt": 64}),
        "plausible-huge": json.dumps({"unit": 1, "groups": [{"kind": "attention", "block_size": 1},
                                                            {"kind": "mamba", "block_size": 4}],
                                      "prompt": 100_000_000, "stored_prompt": 100_000_000, "rules": "pr53324"}),
        "ok": json.dumps({"unit": 4, "groups": [{"kind": "attention", "block_size": 16, "eagle": True},
                                                {"kind": "mamba", "block_size": 16}],
                          "dcp": 2, "prompt": 57, "stored_prompt": 57}),
        "objects": json.dumps([{"group": 0, "boundary": 12288}, {"group": 1, "boundary": 13824}]),
        "many-objects": json.dumps([{"group": 1, "boundary": 128 * k} for k in range(1, 20_000)]),
    }
    out = {}
    for name, text in files.items():
        p = root / f"{name}.json"
        p.write_text(text)
        out[name] = str(p)
    mixed = root / "mixed.jsonl"  # valid, broken UTF-8, valid: the valid answers are kept
    mixed.write_bytes(files["ok"].encode() + b"\n\xff\xfe{\n" + files["ok"].encode() + b"\n"
                      + files["huge-line"].encode() + b"\n" + files["many-groups"].encode() + b"\n")
    out["mixed"] = str(mixed)
    nonutf = root / "nonutf.json"
    nonutf.write_bytes(b"\xff\xfe\x00[")
    out["nonutf"] = str(nonutf)
    out["zero"] = "/dev/zero"
    out["missing"] = str(root / "missing.json")
    out["dir"] = str(root)
    return out


def run_in_process(argv: list[str]) -> tuple[int, str, str, float]:
    """Return (exit code, stdout, stderr, CPU seconds) of one in-process CLI run."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue(), time.process_time() - t0


def assert_contract(argv: list[str], rc: int, out: str, err: str, cpu: float) -> None:
    """Exit 0 with nothing on stderr, or exit 2 with one named-rule line; within the CPU budget."""
    assert cpu < CPU_BUDGET_S, f"{shlex.join(argv)} took {cpu:.2f} s of CPU"
    if rc == 0:
        assert not err, err
    else:
        assert rc == 2, (rc, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and ONE_LINE.match(lines[0]), err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return hostile_files(tmp_path_factory.mktemp("hostile"))


def _digits(k: int) -> str:
    return "".join("0123456789"[(7 * i + 3) % 10] for i in range(k)) or "0"


INTS = st.one_of(st.integers(-3, 70_000).map(str), st.integers(1, 5000).map(_digits),
                 st.integers(0, 130).map(lambda k: str(2 ** k)), st.integers(0, 40).map(lambda k: "-" + str(10 ** k)),
                 st.sampled_from(["", "x", "1e9", "0x10", "١٢٨", "１２８", "128 ", " 12", "+8", "1_000", "nan", "\x00"]))
GROUPS = st.one_of(st.tuples(st.sampled_from(["attention", "mamba", "Attention", "", "mla"]), INTS,
                             st.sampled_from(["", ":eagle", ":EAGLE", ":eagle:x"])).map(lambda t: f"{t[0]}:{t[1]}{t[2]}"),
                   st.text(max_size=12))
FLAG_VALUES = {"--dcp": INTS, "--unit": INTS, "--prompt": INTS, "--stored-prompt": INTS, "--shared": INTS,
               "--group": GROUPS, "--retention": st.sampled_from(["replay", "dense", "", "x"]),
               "--preset": st.sampled_from(["kimi-k3-dcp8", "tiny-dcp2", "small-dcp4", "tiny-two-mamba", "nope"]),
               "--rules": st.sampled_from(["legacy", "pr53324", "vllm-0.33.0", "vllm", ""]),
               "--interleave": INTS, "--pcp": INTS,
               "--stored": st.one_of(INTS, st.tuples(INTS, INTS).map(":".join)),
               "--evict": st.one_of(st.tuples(INTS, INTS).map(":".join), st.tuples(INTS, INTS, INTS).map(":".join))}
FILE_FLAGS = ("--stored-json", "--scenarios")


@st.composite
def argvs(draw: st.DrawFn, names: list[str]) -> list[str]:
    argv = ["explain"]
    for _ in range(draw(st.integers(0, 7))):
        flag = draw(st.sampled_from([*FLAG_VALUES, *FILE_FLAGS]))
        argv += [flag, draw(st.sampled_from(names)) if flag in FILE_FLAGS else draw(FLAG_VALUES[flag])]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


# ~2000 runs: a few seconds (most runs are refused during argument checks; accepted ones are small)
@settings(max_examples=2000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_explain(files, data):
    argv = data.draw(argvs(list(files.values())))
    assert_contract(argv, *run_in_process(argv))


def corpus() -> list[str]:
    return [ln for ln in CORPUS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("line", corpus())
def test_regression_corpus(files, line):
    argv = shlex.split(line.format(**{k.replace("-", "_"): v for k, v in files.items()}))
    assert_contract(argv, *run_in_process(argv))


def test_scenarios_keep_valid_lines(files):
    """A broken line costs one error object; the valid lines before and after it are answered."""
    rc, out, err, cpu = run_in_process(["explain", "--scenarios", files["mixed"]])
    assert rc == 0 and not err and cpu < CPU_BUDGET_S
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["error"]["rule"] if r["error"] else None for r in rows] == [
        None, "input-encoding", None, "limit-prompt", "limit-groups"]


def test_entry_point_under_memory_cap(files):
    """Through the real entry point under a 1 GiB address-space cap: one line, no traceback, in time."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    for argv in (["--stored-json", "/dev/zero", "--preset", "kimi-k3-dcp8", "--prompt", "15000"],
                 ["--preset", "kimi-k3-dcp8", "--dcp", "1000000000000", "--stored-prompt", "1", "--prompt", "1"]):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", *argv], capture_output=True, text=True,
                           timeout=30, preexec_fn=cap)
        assert time.monotonic() - t0 < 10  # includes interpreter start-up
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and ONE_LINE.match(r.stderr.strip()), r.stderr
    # 10^8 tokens on 1-token blocks: past the explicit limit, answered on runs (issue 30), under the same cap
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kvspec.checks", "explain", "--group", "attention:1", "--group", "mamba:4",
                        "--prompt", "100000000", "--stored-prompt", "100000000"], capture_output=True, text=True,
                       timeout=30, preexec_fn=cap)
    assert time.monotonic() - t0 < 10 and r.returncode == 0 and not r.stderr, r.stderr
    assert "hit length: 99999999" in r.stdout and "blocks 0..99999998" in r.stdout


# a 10 ms budget ticks often enough to land in Hypothesis' gc callback now and then: that raise is dropped (and printed
# by pytest as unraisable), the next tick refuses the answer (test_a_budget_raise_python_dropped_is_raised_again)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_answer_past_its_cpu_budget_is_refused_by_name(monkeypatch, tmp_path):
    """Issue 30: a CPU-time budget per answer (checks/cli/budget.py; ITIMER_PROF, not wall time): past it, exit 2 naming
    limit-cpu, nothing printed; with --scenarios only that line is an error object. Shown with a budget of 10 ms on
    scenarios that take ~0.1 s (the timer counts in scheduler ticks)."""
    import kvspec.checks.cli.budget as budget
    monkeypatch.setattr(budget, "CPU_BUDGET_S", 0.01)
    argv = ["explain", "--group", "attention:1", "--group", "mamba:1", "--unit", "1", "--retention", "dense",
            "--stored-prompt", "10000", "--prompt", "10000", "--json"]
    rc, out, err, cpu = run_in_process(argv)
    assert rc == 2 and "limit-cpu" in err and json.loads(out)["error"]["rule"] == "limit-cpu", (rc, err)
    lines = tmp_path / "s.jsonl"
    lines.write_text(json.dumps({"dcp": 1, "unit": 1, "retention": "dense", "prompt": 10000, "stored_prompt": 10000,
                                 "groups": [{"kind": "attention", "block_size": 1}, {"kind": "mamba", "block_size": 1}]})
                     + "\n")
    rc, out, err, cpu = run_in_process(["explain", "--scenarios", str(lines)])
    assert rc == 0 and json.loads(out)["error"]["rule"] == "limit-cpu"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_budget_raise_python_dropped_is_raised_again():
    """The budget's signal can land where Python cannot raise (a __del__, a gc callback: the exception is printed and
    dropped). Found in the suite: Hypothesis' gc callback took it. The timer fires again a tick later, so the block is
    stopped then, not at its end: here the first raise is dropped inside __del__ with the 5 s budget far off, and the
    block is stopped within a fraction of the 1 s it would run (before the fix: after all of it)."""
    import signal

    from kvspec.checks.cli.budget import limit_cpu
    from kvspec.spec.errors import SpecError

    class DropsTheRaise:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGPROF)  # the handler runs here, where its exception is dropped

    t0 = time.process_time()
    with pytest.raises(SpecError, match="limit-cpu"), limit_cpu("the block", seconds=5.0):
        DropsTheRaise()
        while time.process_time() - t0 < 1.0:
            sum(range(1000))
    assert time.process_time() - t0 < 0.5


def test_explicit_listing_is_bounded():
    """--explicit past the explicit limit lists at most 2^20 objects and blocks, else limit-listing (exit 2)."""
    argv = ["explain", "--group", "attention:1", "--group", "mamba:4", "--prompt", "100000000", "--stored-prompt",
            "100000000", "--explicit", "--json"]
    rc, out, err, cpu = run_in_process(argv)
    assert rc == 2 and "limit-listing" in err and cpu < CPU_BUDGET_S


def test_a_budget_signal_swallowed_inside_the_block_still_refuses_the_answer():
    """The SIGPROF handler's exception can land where Python drops it (a gc callback — Hypothesis installs one — or a
    __del__): measured once in the suite, the scenario then ran to its end and was answered. The budget is checked
    again when the block ends."""
    import pytest

    from kvspec.checks.cli.budget import RULE_LIMIT_CPU, limit_cpu
    from kvspec.spec.errors import SpecError
    swallowed = 0
    with pytest.raises(SpecError) as err, limit_cpu("the block", seconds=0.01):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.2:
            try:
                sum(range(1000))
            except SpecError:  # where the handler's exception is lost
                swallowed += 1
    assert err.value.rule == RULE_LIMIT_CPU and swallowed >= 1


def test_ten_thousand_evictions_cost_what_they_name():
    """The held-out fuzz (tools/fuzz_explain.py): 10^4 `--evict` flags took 4.3 s of CPU in argparse alone (its cost is
    quadratic in option strings); the CLI takes the repeatable flags out before it parses. Order, the `=` form and an
    abbreviated flag keep argparse's meaning."""
    from kvspec.checks.cli.main import _gather_repeated
    evict = [a for k in range(1, 10_001) for a in ("--evict", f"0:{16 * k}:0")]
    argv = ["explain", "--dcp", "1", "--unit", "16", "--group", "attention:16", "--group", "mamba:16",
            "--stored-prompt", "1000000", "--prompt", "1000000", *evict, "--json"]
    rc, out, err, cpu = run_in_process(argv)
    assert rc == 0 and not err and cpu < CPU_BUDGET_S, (rc, err, cpu)
    assert json.loads(out)["hit_length"] == 0  # the attention blocks up to 160,000 are gone from rank 0
    rest, got = _gather_repeated(["explain", "--group", "mamba:4", "--prompt", "8", "--group=attention:4",
                                  "--evict", "0:4", "--evict", "-1:4"])
    assert rest == ["explain", "--prompt", "8", "--evict", "-1:4"]  # a value like an option: argparse's error
    assert got == {"group": ["mamba:4", "attention:4"], "evict": ["0:4"]}
    assert _gather_repeated(["explain", "--gro", "a:1", "--group", "b:1"])[1] == {}  # abbreviated: argparse's order
    assert _gather_repeated(["keys", "--group", "a:1"])[1] == {}


@pytest.mark.parametrize("evict, message", [
    ("0:16:5", "evicted rank 5 outside 0..1"), ("0:16:-1", "evicted rank -1"), ("7:16", "evicted group 7"),
    ("0:17", "evicted boundary 17 is not a positive multiple of the unit 16"), ("0:0", "evicted boundary 0")])
def test_an_eviction_no_deployment_holds_is_refused(evict, message):
    """The fuzz found `--evict` silently accepting shards outside the deployment (rank past D, a group it lacks, a
    boundary off the unit grid): each was a no-op. Refused by name (evicted-shard), as the JSON input refuses them."""
    rc, out, err, cpu = run_in_process(["explain", "--group", "attention:16", "--group", "mamba:16", "--unit", "16",
                                        "--dcp", "2", "--prompt", "64", "--stored-prompt", "64", "--evict", evict])
    assert rc == 2 and err.startswith("kvspec: error: evicted-shard: ") and message in err, err


def test_evictions_are_counted_in_shards_before_they_are_listed():
    """10^4 evictions from every rank of D = 64 are 640,000 shards: refused by limit-evicted before they are listed."""
    evict = [a for k in range(1, 10_001) for a in ("--evict", f"0:{16 * k}")]
    rc, out, err, cpu = run_in_process(["explain", "--dcp", "64", "--unit", "16", "--group", "attention:1",
                                        "--group", "mamba:16", "--stored-prompt", "1000000", "--prompt", "1000000",
                                        *evict])
    assert rc == 2 and "limit-evicted" in err and "640000" in err and cpu < CPU_BUDGET_S, (err, cpu)
