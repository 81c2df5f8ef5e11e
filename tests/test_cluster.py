"""The harness's port leases: two owners are never handed the same loopback port (no bind-release race)."""

from __future__ import annotations

import socket
import subprocess
import sys

from kvspec.impl.cluster import lease_port


def test_leases_are_distinct_and_exclusive():
    leases = [lease_port() for _ in range(40)]
    try:
        ports = {le.port for le in leases}
        assert len(ports) == 40
        lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        assert not any(lo <= p <= hi for p in ports)  # never an ephemeral port
        # another process asking for many ports is never handed one of ours
        code = "from kvspec.impl.cluster import lease_port\nprint(' '.join(str(lease_port().port) for _ in range(200)))"
        theirs = set(map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True).stdout.split()))
        assert len(theirs) == 200 and not theirs & ports
    finally:
        for le in leases:
            le.close()


def test_a_listening_port_is_skipped(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        import kvspec.impl.cluster as cluster
        monkeypatch.setattr(cluster, "_candidate_ports", lambda: [busy, 23456, 23457])
        monkeypatch.setattr(cluster, "_next_port", 0)
        le = lease_port()
        try:
            assert le.port in (23456, 23457)
        finally:
            le.close()


def test_forked_ranks_are_processes_of_their_own_and_their_cpu_is_counted(tmp_path):
    """run_ranks forks each rank from a server that imported torch once: each rank is its own process with its own
    RANK, the caller's folder and its own log; once the server is stopped (stop_rank_server, as the suite does at its
    end) the ranks' CPU time is among the caller's children's, so the suite's CPU figure includes every rank."""
    import os
    import resource

    from kvspec.impl import cluster
    from kvspec.impl.job import Job
    from kvspec.spec.geometry import Geometry, Group, Parallel

    from .conftest import require
    require("torch")
    job = Job(master="127.0.0.1:1", geometry=Geometry(unit=1, groups=(Group(kind="attention", block_size=1),),
                                                      parallel=Parallel(dcp=2)))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    ranks = cluster.run_ranks(job, 2, timeout_s=120, workdir=str(tmp_path), module="tests.support.busy_rank")
    cluster.stop_rank_server()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert [r["rank"] for r in ranks] == [0, 1] and [r["env_rank"] for r in ranks] == ["0", "1"]
    assert len({r["pid"] for r in ranks} | {os.getpid()}) == 3 and {r["cwd"] for r in ranks} == {os.getcwd()}
    assert all((tmp_path / f"rank{r}.log").read_text().strip() == f"rank {r} done" for r in (0, 1))
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) >= 0.5
