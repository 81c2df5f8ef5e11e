"""Real parts for tests and benchmarks: a mooncake_master on loopback, and D rank processes.

Processes are started with PR_SET_PDEATHSIG (they die with their parent) and stopped by PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pdeathsig() -> None:  # pragma: no cover - runs in the child
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def find_master_binary() -> str:
    """Return the mooncake_master executable of this environment."""
    cand = Path(sys.executable).with_name("mooncake_master")
    exe = str(cand) if cand.exists() else shutil.which("mooncake_master")
    if not exe:
        raise FileNotFoundError("mooncake_master not found: install the mooncake extra (make venv)")
    return exe


class Master:
    """A running mooncake_master: address, PID, log path."""

    def __init__(self, proc: subprocess.Popen[bytes], rpc_port: int, metrics_port: int, log: Path) -> None:
        self.proc = proc
        self.rpc_port = rpc_port
        self.metrics_port = metrics_port
        self.log = log

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Stop the master by PID: SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_master(log_dir: str | None = None, rpc_port: int | None = None, lease_ttl_ms: int = 200) -> Master:
    """Start a master on free loopback ports and wait until /health says service_ready."""
    rpc = rpc_port or free_port()
    metrics = free_port()
    log = Path(log_dir or tempfile.mkdtemp(prefix="kvspec-master-")) / f"master-{rpc}.log"
    cmd = [find_master_binary(), "--rpc_address=127.0.0.1", f"--rpc_port={rpc}", "--metrics_host=127.0.0.1",
           f"--metrics_port={metrics}", "--rpc_thread_num=2", "--client_ttl=2",
           f"--default_kv_lease_ttl={lease_ttl_ms}ms", "--enable_metric_reporting=false"]
    fh = open(log, "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, process_group=0, preexec_fn=_pdeathsig)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {proc.returncode}; log: {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=1) as r:
                if json.loads(r.read()).get("service_ready"):
                    return Master(proc, rpc, metrics, log)
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"mooncake_master not ready in 30 s; log: {log}")


@contextlib.contextmanager
def running_master(log_dir: str | None = None) -> Iterator[Master]:
    """Yield a running master; stop it by PID afterwards, whatever happened."""
    m = start_master(log_dir)
    try:
        yield m
    finally:
        m.stop()


def run_ranks(job: dict[str, Any], world: int, timeout_s: float = 300, workdir: str | None = None,
              env: dict[str, str] | None = None, during: Any = None) -> list[dict[str, Any]]:
    """Run `python -m kvspec.impl.worker` as `world` rank processes on one job; return each rank's result.

    `during(pids)`, if given, runs in the parent while the ranks run (fault injection).
    """
    wd = Path(workdir or tempfile.mkdtemp(prefix="kvspec-job-"))
    wd.mkdir(parents=True, exist_ok=True)
    job_path = wd / "job.json"
    job_path.write_text(json.dumps(job))
    port = free_port()
    procs = []
    base_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                "MC_STORE_CLIENT_SETUP_RETRIES": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    for r in range(world):
        out, err = wd / f"rank{r}.json", open(wd / f"rank{r}.log", "wb")  # noqa: SIM115
        procs.append((subprocess.Popen([sys.executable, "-m", "kvspec.impl.worker", str(job_path), str(r), str(out)],
                                       env={**base_env, "RANK": str(r)}, stdout=err, stderr=subprocess.STDOUT,
                                       preexec_fn=_pdeathsig), out, err))
    deadline = time.monotonic() + timeout_s
    try:
        if during is not None:
            during([p.pid for p, _, _ in procs])
        for p, _, _ in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p, _, fh in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
            fh.close()
    results = []
    for r, (p, out, _) in enumerate(procs):
        if p.returncode != 0 or not out.exists():
            tail = (wd / f"rank{r}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"rank {r} failed (rc {p.returncode}); log tail:\n{tail}")
        results.append(json.loads(out.read_text()))
    return results


class RankServers:
    """D long-lived rank processes (`worker --serve`) driven by JSON commands; stopped by PID."""

    def __init__(self, job: dict[str, Any], world: int, workdir: str, timeout_s: float = 60) -> None:
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "job.json").write_text(json.dumps(job))
        port = free_port()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
               "MC_STORE_CLIENT_SETUP_RETRIES": "1", "PYTHONUNBUFFERED": "1"}
        self.timeout_s = timeout_s
        self.logs = [open(wd / f"server{r}.log", "wb") for r in range(world)]  # noqa: SIM115
        self.procs = [subprocess.Popen([sys.executable, "-m", "kvspec.impl.worker", "--serve", str(wd / "job.json"),
                                        str(r)], env={**env, "RANK": str(r)}, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=self.logs[r], preexec_fn=_pdeathsig)
                      for r in range(world)]

    def _read(self, r: int) -> dict[str, Any]:
        import select
        p = self.procs[r]
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], self.timeout_s)
        if not ready:
            self.close()
            raise TimeoutError(f"rank {r} did not answer in {self.timeout_s} s")
        line = p.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError(f"rank {r} exited (rc {p.poll()})")
        return json.loads(line)

    def call(self, rank: int, cmd: dict[str, Any]) -> dict[str, Any]:
        """Send one command to one rank and return its answer."""
        p = self.procs[rank]
        assert p.stdin is not None
        p.stdin.write((json.dumps(cmd) + "\n").encode())
        p.stdin.flush()
        return self._read(rank)

    def call_all(self, cmd: dict[str, Any]) -> list[dict[str, Any]]:
        """Send a (collective) command to every rank, then collect every answer."""
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write((json.dumps(cmd) + "\n").encode())
            p.stdin.flush()
        return [self._read(r) for r in range(len(self.procs))]

    def close(self) -> None:
        """Ask every rank to quit, then stop what is left by PID."""
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                try:
                    p.stdin.write(b'{"op": "quit"}\n')
                    p.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for fh in self.logs:
            fh.close()
