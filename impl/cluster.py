"""Real parts for tests and benchmarks: a mooncake_master on loopback, and D rank processes.

Processes are started with PR_SET_PDEATHSIG (they die with their parent) and stopped by PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import random
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

from .job import Job, encode_job

PORT_LOCKS = Path(tempfile.gettempdir()) / "kvspec-ports"


class PortLease:
    """A loopback TCP port held for one owner: an exclusive flock on PORT_LOCKS/<port>.lock, released on close.

    Ports come from outside the kernel's ephemeral range (so no outgoing connection or port-0 bind takes
    them), a lock file excludes every other kvspec process, and a probe bind excludes a port already in
    use. Unlike bind-release-reuse, two kvspec processes can never be handed the same port.
    """

    def __init__(self, port: int, fd: int) -> None:
        self.port, self._fd = port, fd

    def close(self) -> None:
        """Release the port."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@functools.lru_cache(maxsize=1)
def _candidate_ports() -> list[int]:
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    ports = [p for p in range(20000, 65536) if not lo <= p <= hi]
    random.SystemRandom().shuffle(ports)
    return ports


_next_port = 0  # where this process's next search starts in its shuffled candidate list


def lease_port() -> PortLease:
    """Return a lease on a loopback port no other kvspec process holds and nothing listens on."""
    import fcntl
    PORT_LOCKS.mkdir(parents=True, exist_ok=True)
    ports = _candidate_ports()
    global _next_port  # noqa: PLW0603 - one search cursor per process
    for k in range(len(ports)):
        port = ports[(_next_port + k) % len(ports)]
        fd = os.open(PORT_LOCKS / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                os.close(fd)
                continue
        _next_port = (_next_port + k + 1) % len(ports)
        return PortLease(port, fd)
    raise RuntimeError("no free loopback port outside the ephemeral range")


def _pdeathsig() -> None:  # pragma: no cover - runs in the child
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn(cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """Start a child that dies with this process (PR_SET_PDEATHSIG)."""
    return subprocess.Popen(cmd, preexec_fn=_pdeathsig, **kw)  # noqa: PLW1509 - the hook only calls prctl


def find_master_binary() -> str:
    """Return the mooncake_master executable of this environment."""
    cand = Path(sys.executable).with_name("mooncake_master")
    exe = str(cand) if cand.exists() else shutil.which("mooncake_master")
    if not exe:
        raise FileNotFoundError("mooncake_master not found: install the mooncake extra (make venv)")
    return exe


class Master:
    """A running mooncake_master: address, PID, log path; its two ports are leased until stop()."""

    def __init__(self, rpc: PortLease, metrics: PortLease, log_dir: Path, lease_ttl_ms: int) -> None:
        self._rpc, self._metrics, self.log_dir, self.lease_ttl_ms = rpc, metrics, log_dir, lease_ttl_ms
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = log_dir / f"master-{rpc.port}.log"
        self.starts = 0

    @property
    def rpc_port(self) -> int:
        return self._rpc.port

    @property
    def metrics_port(self) -> int:
        return self._metrics.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        """Start the master process on its leased ports; wait until /health says service_ready."""
        self.starts += 1
        cmd = [find_master_binary(), "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}",
               "--metrics_host=127.0.0.1", f"--metrics_port={self.metrics_port}", "--rpc_thread_num=2",
               "--client_ttl=2", f"--default_kv_lease_ttl={self.lease_ttl_ms}ms", "--enable_metric_reporting=false"]
        with open(self.log, "ab") as fh:
            self.proc = _spawn(cmd, stdout=fh, stderr=subprocess.STDOUT, process_group=0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}; log: {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=1) as r:
                    if json.loads(r.read()).get("service_ready"):
                        return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"mooncake_master not ready in 30 s; log: {self.log}")

    def kill(self) -> None:
        """SIGKILL the master process by PID (a crash); its ports stay leased for restart()."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        """Kill the master (every object is lost) and start a fresh one on the same ports."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Stop the master by PID (SIGTERM, then SIGKILL) and release its ports."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._rpc.close()
        self._metrics.close()


def start_master(log_dir: str | None = None, lease_ttl_ms: int = 200) -> Master:
    """Start a master on two leased loopback ports and wait until it is ready."""
    m = Master(lease_port(), lease_port(), Path(log_dir or tempfile.mkdtemp(prefix="kvspec-master-")), lease_ttl_ms)
    try:
        m.start()
    except BaseException:
        m.stop()
        raise
    return m


@contextlib.contextmanager
def running_master(log_dir: str | None = None) -> Iterator[Master]:
    """Yield a running master; stop it by PID afterwards, whatever happened."""
    m = start_master(log_dir)
    try:
        yield m
    finally:
        m.stop()


def _rendezvous(workdir: Path) -> str:
    """Return a fresh file:// rendezvous for torch.distributed in workdir (no TCP port to collide on)."""
    path = workdir / f"rendezvous-{os.getpid()}-{time.monotonic_ns()}"
    path.unlink(missing_ok=True)
    return f"file://{path}"


PRELOAD = ("torch", "torch.distributed")  # what a rank's server imports once (≈1.5 s of CPU per rank otherwise)


@functools.cache
def _rank_context() -> Any:
    """Return the multiprocessing context rank processes start from: a fork server that imported PRELOAD once (no
    Mooncake client, no process group, no CUDA in it); each rank is still its own process with its own store client and
    process group, forked from that server instead of importing torch again."""
    import multiprocessing as mp
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def stop_rank_server() -> None:
    """Stop the rank fork server, if one started, and wait for it: its ranks' CPU time then counts among this process's
    children's (RUSAGE_CHILDREN), as a spawned rank's did — the speed figures of the suite include every rank."""
    if _rank_context.cache_info().currsize:
        from multiprocessing import forkserver
        forkserver._forkserver._stop()  # type: ignore[attr-defined]  # the stdlib's stop (waits for it); none public
        _rank_context.cache_clear()


def _rank_main(module: str, argv: list[str], env: dict[str, str], cwd: str, log: str) -> None:  # pragma: no cover
    """Run `python -m MODULE ARGV…` in this forked rank process: its environment, folder and log as a fresh process's;
    dies with its server (PR_SET_PDEATHSIG), which dies with the caller."""
    import runpy
    _pdeathsig()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams, line-buffered
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def run_ranks(job: Job, world: int, timeout_s: float = 300, workdir: str | None = None,
              env: dict[str, str] | None = None, during: Any = None,
              module: str = "kvspec.impl.worker") -> list[dict[str, Any]]:
    """Run `python -m MODULE JOB RANK OUT` as `world` rank processes on one job; return each rank's result.

    Each rank is forked from a server that imported torch once (_rank_context); `during(pids)`, if given, runs in the
    parent while the ranks run (fault injection).
    """
    wd = Path(workdir or tempfile.mkdtemp(prefix="kvspec-job-"))
    wd.mkdir(parents=True, exist_ok=True)
    job_path = wd / "job.json"
    job_path.write_text(json.dumps(encode_job(job)))
    base_env = {**os.environ, "KVSPEC_RENDEZVOUS": _rendezvous(wd), "WORLD_SIZE": str(world),
                "MC_STORE_CLIENT_SETUP_RETRIES": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    ctx, procs = _rank_context(), []
    for r in range(world):
        out = wd / f"rank{r}.json"
        p = ctx.Process(target=_rank_main, args=(module, [str(job_path), str(r), str(out)],
                                                 {**base_env, "RANK": str(r)}, os.getcwd(), str(wd / f"rank{r}.log")),
                        name=f"rank{r}")
        p.start()
        procs.append((p, out))
    deadline = time.monotonic() + timeout_s
    try:
        if during is not None:
            during([p.pid for p, _ in procs])
        for p, _ in procs:
            p.join(max(0.1, deadline - time.monotonic()))
    finally:
        for p, _ in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    results = []
    for r, (p, out) in enumerate(procs):
        if p.exitcode != 0 or not out.exists():
            tail = (wd / f"rank{r}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"rank {r} failed (rc {p.exitcode}); log tail:\n{tail}")
        results.append(json.loads(out.read_text()))
    return results


class RankServers:
    """D long-lived rank processes (`worker --serve`) driven by JSON commands; stopped by PID."""

    def __init__(self, job: Job, world: int, workdir: str, timeout_s: float = 60) -> None:
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "job.json").write_text(json.dumps(encode_job(job)))
        env = {**os.environ, "KVSPEC_RENDEZVOUS": _rendezvous(wd), "WORLD_SIZE": str(world),
               "MC_STORE_CLIENT_SETUP_RETRIES": "1", "PYTHONUNBUFFERED": "1"}
        self.timeout_s = timeout_s
        self.logs = [open(wd / f"server{r}.log", "wb") for r in range(world)]  # noqa: SIM115
        self.procs = [_spawn([sys.executable, "-m", "kvspec.impl.worker", "--serve", str(wd / "job.json"),
                                        str(r)], env={**env, "RANK": str(r)}, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=self.logs[r])
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
        answer: dict[str, Any] = json.loads(line)
        return answer

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
        quit_processes(self.procs, self.logs, wait_s=15)


def quit_processes(procs: list[subprocess.Popen[bytes]], logs: list[Any], wait_s: float) -> list[int]:
    """Send {"op": "quit"} to each serving process, wait, SIGKILL what is left by PID, close the logs;
    return the PIDs still alive (none, unless a kill failed)."""
    for p in procs:
        if p.poll() is None and p.stdin is not None:
            try:
                p.stdin.write(b'{"op": "quit"}\n')
                p.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    for fh in logs:
        fh.close()
    return [p.pid for p in procs if p.poll() is None]
