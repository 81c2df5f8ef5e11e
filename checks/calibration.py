"""A speed figure is only comparable with its machine: each timed command measures this machine in the same run.

`measure_calibration` times a fixed pure-Python loop (10⁷ additions, best of 3) — the kind of work the spec's
checks do — and reports it with the machine's name and core count. `kvspec verify` and `kvspec bench` print it
beside their wall and CPU times, so a figure is read as a multiple of the calibration ("verify took N loop
units"), not as seconds on an unknown machine. These VMs vary up to 4× in speed.
"""

from __future__ import annotations

import os
import platform
import resource
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
