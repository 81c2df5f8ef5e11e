"""Run the `kvspec` command line in-process and capture what it printed."""

from __future__ import annotations

from typing import Any

from kvspec.checks.cli.main import main


def run_cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """Return (exit status, stdout, stderr) of `kvspec ARGV` (a SystemExit's code counts as the status)."""
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err  # type: ignore[return-value]
