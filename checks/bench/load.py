"""Live load: concurrent stores, lookups, loads and evictions over shared prefixes on a real master.

D rank processes (kvspec.impl.load_worker), each with up to 16 requests in flight, driven by
`streams` client threads for a bounded time; the master is killed and restarted once mid-run
(every object is lost; requests in flight fail and are counted, never trusted). Reported:
requests/s, p50/p99 latency of store, lookup and load, bytes compared and wrong, hangs (a command
unanswered within its timeout), failed commands, and what is left after the run (registered
buffers per rank, live processes). Used by tests/test_load.py and `kvspec bench --json` ("load").
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvspec.checks.conform.adapters import compute_impl_store_rule
from kvspec.impl.job import Job, encode_job
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.rules import VLLM_0_33, compute_lookahead, get_rules

COMMAND_TIMEOUT_S = 60.0


class LoadRanks:
    """D load_worker processes; commands are answered out of order, matched by id."""

    def __init__(self, job: Job, world: int, workdir: Path) -> None:
        from kvspec.impl.cluster import _spawn
        (workdir / "load-job.json").write_text(json.dumps(encode_job(job)))
        self.logs = [open(workdir / f"load-rank{r}.log", "wb") for r in range(world)]  # noqa: SIM115
        self.procs = [_spawn([sys.executable, "-m", "kvspec.impl.load_worker", "--serve",
                              str(workdir / "load-job.json"), str(r)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=self.logs[r]) for r in range(world)]
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._readers = [threading.Thread(target=self._read, args=(p,), daemon=True) for p in self.procs]
        for t in self._readers:
            t.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            ans = json.loads(line)
            with self._lock:
                ev, box = self._waiting.pop(ans["id"])
            box.append(ans)
            ev.set()

    def send(self, rank: int, cmd: dict[str, Any]) -> tuple[threading.Event, list[dict[str, Any]]]:
        """Send one command to one rank; return (event, box) that the answer fills."""
        ev, box = threading.Event(), list[dict[str, Any]]()
        with self._lock:
            cid = next(self._ids)
            self._waiting[cid] = (ev, box)
            stdin = self.procs[rank].stdin
            assert stdin is not None
            stdin.write((json.dumps({**cmd, "id": cid}) + "\n").encode())
            stdin.flush()
        return ev, box

    def call_many(self, calls: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any] | None]:
        """Send commands to ranks at once; return the answers (None for one unanswered in time: a hang)."""
        pending = [self.send(r, c) for r, c in calls]
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        return [box[0] if ev.wait(max(0.0, deadline - time.monotonic())) else None for ev, box in pending]

    def close(self) -> list[int]:
        """Ask every rank to quit; stop what is left by PID; return the PIDs still alive after (should be [])."""
        from kvspec.impl.cluster import quit_processes
        return quit_processes(self.procs, self.logs, wait_s=30)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def run_load(dcp: int = 2, streams: int = 16, seconds: float = 30.0, restart: bool = True, seed: int = 0,
             rules: str = VLLM_0_33, workdir: str | None = None, evict_p: float = 0.15,
             evict_force: bool = False) -> dict[str, Any]:
    """Run the load for `seconds` and return its figures (see the module docstring).

    Evictions remove a third of an earlier request's keys on one rank the way the master's own eviction
    does, respecting leases (a key an exist or get leased recently answers -706 and stays). With
    `evict_force` they skip the lease check instead (Mooncake's force=True, which fault tests use to
    inject a -704 between lookup and load): see the note in checks/README.md on what that does to a
    get in flight.
    """
    from kvspec.impl.cluster import running_master

    geometry = Geometry(unit=4, groups=(Group(kind="attention", block_size=16, eagle=True),
                                        Group(kind="mamba", block_size=16)), parallel=Parallel(dcp=dcp))
    wd = Path(workdir or tempfile.mkdtemp(prefix="kvspec-load-"))
    stats: dict[str, Any] = {"requests": 0, "stores": 0, "lookups": 0, "loads": 0, "evictions": 0, "hits": 0,
                             "bytes_compared": 0, "bytes_wrong": 0, "bytes_wrong_in_clean_loads": 0,
                             "draft_lookahead_bytes": 0, "hangs": 0,
                             "errors": 0, "error_samples": [], "store_failures": 0, "load_failures": 0,
                             "partial_loads": 0, "restarts": 0}
    lat: dict[str, list[float]] = {"store": [], "lookup": [], "load": [], "evict": []}
    lock = threading.Lock()
    with running_master(str(wd)) as m:
        job = Job(master=m.address, geometry=geometry, width=4, model="kvspec-load", store_rule=compute_impl_store_rule(rules),
                  lookahead=compute_lookahead(get_rules(rules), geometry), concurrency=16, segment_bytes=128 << 20)
        ranks = LoadRanks(job, dcp, wd)
        t0 = time.monotonic()
        stop = t0 + seconds

        def note(answers: list[dict[str, Any] | None], kind: str) -> list[dict[str, Any]]:
            good = []
            with lock:
                for a in answers:
                    if a is None:
                        stats["hangs"] += 1
                    elif not a["ok"]:
                        stats["errors"] += 1
                        if len(stats["error_samples"]) < 3:
                            stats["error_samples"].append(a["error"])
                    else:
                        good.append(a)
                if len(good) == len(answers) and good:
                    lat[kind].append(max(a["seconds"] for a in good))
            return good

        def stream(k: int) -> None:
            rng = random.Random(seed * 1000 + k)
            history: list[dict[str, Any]] = []
            for j in itertools.count():
                if time.monotonic() >= stop:
                    return
                conv = rng.randrange(6)  # shared prefixes across streams: six conversations
                shared = rng.choice([0, 64, 128, 200, 256])
                req = {"prefix_seed": 100 + conv, "shared": shared, "seed": (seed * 1000 + k) * 100_000 + j,
                       "prompt": shared + rng.randint(1, 200)}
                st = note(ranks.call_many([(r, {"op": "store", **req}) for r in range(dcp)]), "store")
                look_req = dict(req, seed=req["seed"] + 50_000) if rng.random() < 0.5 else req  # a resend or a sibling
                lk = note(ranks.call_many([(k % dcp, {"op": "lookup", **look_req})]), "lookup")
                lds: list[dict[str, Any]] = []
                if lk:
                    hit, tails = lk[0]["hit"], lk[0]["tails"]
                    lds = note(ranks.call_many([(r, {"op": "load", **look_req, "hit": hit, "tails": tails})
                                                for r in range(dcp)]), "load") if hit > 0 else []
                evicted = False
                if history and rng.random() < evict_p:
                    old = rng.choice(history)
                    evicted = bool(note(ranks.call_many([(rng.randrange(dcp), {"op": "evict", **old,
                                                                               "start": rng.randrange(3),
                                                                               "step": 3, "force": evict_force})]),
                                        "evict"))
                history.append(req)
                with lock:
                    stats["requests"] += 1
                    stats["stores"] += len(st)
                    stats["store_failures"] += sum(bool(a["failed"]) for a in st)
                    stats["lookups"] += len(lk)
                    stats["hits"] += sum(a["hit"] > 0 for a in lk)
                    stats["loads"] += len(lds)
                    stats["evictions"] += evicted
                    for a in lds:
                        stats["bytes_compared"] += a["bytes_compared"]
                        stats["bytes_wrong"] += a["bytes_wrong"]
                        stats["bytes_wrong_in_clean_loads"] += a["wrong_in_clean_load"]
                        stats["draft_lookahead_bytes"] += a["draft_lookahead_bytes"]
                        stats["load_failures"] += bool(a["failed"])
                        stats["partial_loads"] += a["safe"] < lk[0]["hit"]

        threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in range(streams)]
        for t in threads:
            t.start()
        if restart:
            time.sleep(seconds / 2)
            m.restart()  # SIGKILL, then a fresh master on the same leased ports: every object is lost
            stats["restarts"] += 1
        for t in threads:
            t.join(seconds + 4 * COMMAND_TIMEOUT_S)
        elapsed = time.monotonic() - t0
        stats["stuck_streams"] = sum(t.is_alive() for t in threads)
        after = ranks.call_many([(r, {"op": "stats"}) for r in range(dcp)])
        stats["registered_after"] = [a["registered"] if a else None for a in after]
        stats["leaked_pids"] = ranks.close()
    stats.update({"dcp": dcp, "streams": streams, "seconds": round(elapsed, 2), "rules": rules,
                  "evict_force": evict_force,
                  "requests_per_s": round(stats["requests"] / elapsed, 2),
                  **{f"{kind}_ms": {"p50": _pct(xs, 0.5), "p99": _pct(xs, 0.99),
                                    "mean": round(1000 * statistics.fmean(xs), 2) if xs else 0.0}
                     for kind, xs in lat.items()}})
    return stats
