"""Hypothesis profiles (dev, ci, nightly) and shared fixtures."""

from __future__ import annotations

import importlib
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=5000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def require(module: str):
    """Import an optional dependency: skip locally when it is missing, fail under CI (a skip there would hide
    a missing install step)."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def master(tmp_path_factory):
    """A real mooncake_master on free loopback ports for the whole run; stopped by PID at the end."""
    require("mooncake.store")
    from kvspec.impl.cluster import start_master
    m = start_master(str(tmp_path_factory.mktemp("master")))
    yield m
    m.stop()


# ---------------------------------------------------------------- the suite's own speed, with its calibration
_START: dict[str, float] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the suite's clocks: wall, and CPU of this process and the processes it waited for."""
    import time

    from kvspec.checks.calibration import measure_cpu_seconds
    _START.update(wall=time.perf_counter(), cpu=measure_cpu_seconds())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the rank fork server of this process (an xdist worker's too) and wait for it, so the ranks' CPU time is in
    the suite's figure (kvspec.impl.cluster.stop_rank_server)."""
    import sys
    cluster = sys.modules.get("kvspec.impl.cluster")
    if cluster is not None:
        cluster.stop_rank_server()


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    """Print the suite's wall and CPU time with this machine's calibration measured now (a figure in loop units)."""
    import time

    from kvspec.checks.calibration import format_calibrated, measure_calibration, measure_cpu_seconds
    if not _START:
        return
    wall, cpu = time.perf_counter() - _START["wall"], measure_cpu_seconds() - _START["cpu"]
    line = f"kvspec test suite: {format_calibrated(wall, cpu, measure_calibration())}"
    terminalreporter.write_line(line)
