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
