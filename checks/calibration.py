"""A speed figure is only comparable with its machine: each timed command measures this machine in the same run.

`measure_calibration` times a fixed pure-Python loop (10⁷ additions, best of 3) — the kind of work the spec's
checks do — and reports it with the machine's name and core count. `kvspec verify` and `kvspec bench` print it
beside their wall and CPU times, so a figure is read as a multiple of the calibration ("verify took N loop
units"), not as seconds on an unknown machine. These VMs vary up to 4× in speed.

Each whole command has a target in wall loop units (`TARGETS`, issue 30), printed beside its figure with whether the
run met it. `python3 checks/calibration.py --target NAME -- COMMAND…` runs a command and prints the same line for it
(how `make test` and `.ci/run` time themselves); this file needs only the standard library for that reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any

LOOP = 10**7


def _loop() -> float:
    t0, x = time.perf_counter(), 0
    for i in range(LOOP):
        x += i
    return time.perf_counter() - t0


def read_cpu_model() -> str:
    """Return the CPU's model name (Linux /proc/cpuinfo), else the platform's machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_calibration() -> dict[str, Any]:
    """Return this machine's calibration: the best of three timings of the fixed loop, the CPU, the cores."""
    best = min(_loop() for _ in range(3))
    return {"loop_seconds": round(best, 3), "loop": f"{LOOP:,} Python additions, best of 3",
            "machine": read_cpu_model(), "cores": os.cpu_count(),
            "python": platform.python_version()}


def measure_cpu_seconds() -> float:
    """Return the CPU seconds (user + system) this process and its waited-for children have used so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def format_calibrated(wall: float, cpu: float, cal: dict[str, Any]) -> str:
    """Return 'wall W s, CPU C s on M (K cores); calibration loop L s: W/L and C/L loop units'."""
    unit = cal["loop_seconds"] or 1e-9
    return (f"wall {wall:.1f} s, CPU {cpu:.1f} s on {cal['machine']} ({cal['cores']} cores, Python {cal['python']}); "
            f"calibration loop {cal['loop_seconds']} s: {wall / unit:.0f} wall and {cpu / unit:.0f} CPU loop units")


@dataclasses.dataclass(frozen=True)
class Target:
    """A whole command's speed target: at most `wall_units` wall loop units on 2 cores (issue 30)."""

    command: str
    wall_units: int

    @property
    def minutes_at_half_second(self) -> float:
        """Return the target as minutes where the calibration loop takes 0.5 s."""
        return self.wall_units * 0.5 / 60


TARGETS = {
    "verify": Target("make verify", 120),
    "test": Target("make test", 720),
    "ci": Target(".ci/run from a clean clone", 1440),
}


def compute_target(name: str, wall: float, cal: dict[str, Any]) -> dict[str, Any]:
    """Return {wall_loop_units: the target, measured: wall / loop (rounded), met: wall / loop <= the target}."""
    t, units = TARGETS[name], wall / (cal["loop_seconds"] or 1e-9)
    return {"wall_loop_units": t.wall_units, "measured": round(units), "met": units <= t.wall_units}


def format_target(name: str, wall: float, cal: dict[str, Any]) -> str:
    """Return 'target (issue 30): NAME ≤ T wall loop units (M min at a 0.5 s loop): W — met | NOT met'."""
    t, r = TARGETS[name], compute_target(name, wall, cal)
    return (f"target (issue 30): {t.command} ≤ {t.wall_units} wall loop units ({t.minutes_at_half_second:g} min at a "
            f"0.5 s loop): {r['measured']} — {'met' if r['met'] else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    """Run a command; print its wall and CPU time, this machine's calibration and its target; return its exit code."""
    ap = argparse.ArgumentParser(prog="checks/calibration.py", description=main.__doc__)
    ap.add_argument("--target", choices=sorted(TARGETS), required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS…")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command to time")
    t0, c0 = time.perf_counter(), measure_cpu_seconds()
    rc = subprocess.call(command)
    wall, cpu = time.perf_counter() - t0, measure_cpu_seconds() - c0
    cal = measure_calibration()
    print(f"{TARGETS[args.target].command}: {format_calibrated(wall, cpu, cal)}\n{format_target(args.target, wall, cal)}",
          flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
