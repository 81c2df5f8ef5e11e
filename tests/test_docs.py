"""Docs that can't drift: every `$ kvspec …` block in the READMEs and docs/ is re-run and compared with its output.

A block is a fenced code block whose first line is `$ kvspec ARGS` (a comment after `#` is dropped). The block's
other lines must appear in the command's output in order; a line `...` stands for any lines (also none), and
`...` inside a line for any text. Timings (`12.3 s`) are compared as `<t> s`. Blocks run with
`.venv-vllm/bin/kvspec` are checked by tests/test_vllm_conformance.py, in the venv that has vLLM.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "spec" / "README.md", ROOT / "checks" / "README.md",
               ROOT / "vectors" / "README.md", *(ROOT / "docs").glob("*.md")])
TIME = re.compile(r"\d+(\.\d+)? s\b")


def iterate_blocks(prefix: str = "$ kvspec ") -> list[tuple[str, int, str, list[str]]]:
    """Return (file, line, command, expected lines) of every command block whose command starts with prefix."""
    out = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```") and i + 1 < len(lines) and lines[i + 1].startswith(prefix):
                j = i + 2
                while not lines[j].startswith("```"):
                    j += 1
                cmd = lines[i + 1][2:].split("  #")[0].strip()
                out.append((str(path.relative_to(ROOT)), i + 2, cmd, lines[i + 2:j]))
                i = j
            i += 1
    return out


def _pattern(line: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(re.escape(TIME.sub("<t> s", part)) for part in line.split("...")) + "$")


def compare_block(expected: list[str], output: str) -> str | None:
    """Return why the output does not show the expected lines in order (None when it does)."""
    got = [TIME.sub("<t> s", x.rstrip()) for x in output.splitlines()]
    k, loose = 0, False
    for line in expected:
        if line.strip() == "...":
            loose = True
            continue
        pat = _pattern(line.rstrip())
        while k < len(got) and not pat.match(got[k]):
            if not loose:
                return f"expected {line!r}, got {got[k]!r}"
            k += 1
        if k == len(got):
            return f"expected {line!r}: not in the output"
        k, loose = k + 1, False
    return None


BLOCKS = iterate_blocks()


def test_the_docs_have_command_blocks():
    where = {f for f, *_ in BLOCKS}
    assert {"README.md", "docs/porting.md"} <= where and len(BLOCKS) >= 4


@pytest.mark.parametrize("path,line,cmd,expected", BLOCKS, ids=[f"{f}:{n}" for f, n, *_ in BLOCKS])
def test_every_doc_command_prints_what_the_doc_shows(path, line, cmd, expected):
    """Run as the reader would: a fresh process from the checkout's root (a search's seed is per process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("HYPOTHESIS_PROFILE", None)
    r = subprocess.run([sys.executable, "-m", "kvspec.checks", *shlex.split(cmd)[1:]], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout
    why = compare_block(expected, out)
    assert why is None, f"{path}:{line} `{cmd}` drifted: {why}\n--- output ---\n{out}"


def test_the_block_comparison_can_fail():
    assert compare_block(["a", "...", "c"], "a\nb\nc") is None
    assert compare_block(["a", "c"], "a\nb\nc") is not None  # no skipping without `...`
    assert compare_block(["hit 14848"], "hit 14976") is not None
    assert compare_block(["took 1.5 s"], "took 22.1 s") is None and compare_block(["x ... z"], "x yy z") is None
