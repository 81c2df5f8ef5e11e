"""Fault injection on the real store and rank processes: the spec's predicted outcome, 0 wrong bytes, bounded time."""

from __future__ import annotations

import os
import time

import attrs
import pytest

from kvspec.impl.mooncake_store import OBJECT_HAS_LEASE, OBJECT_NOT_FOUND, RPC_FAIL, RPC_TIMEOUT, TRANSFER_FAIL
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.scenario import Scenario, StoredRequest

from .conftest import require
from .support.live import build_job, compare, run, with_faults

pytestmark = [pytest.mark.live, pytest.mark.faults]
cluster = require("kvspec.impl.cluster")


def geometry(dcp: int, retention: str) -> Geometry:
    return Geometry(unit=4, groups=(Group(kind="attention", block_size=16, eagle=True),
                                    Group(kind="mamba", block_size=16)),
                    parallel=Parallel(dcp=dcp), retention=retention)


def test_eviction_between_lookup_and_load(master, tmp_path):
    """One rank's shard removed after the lookup confirmed it: -704 at load, closure to the spec's safe boundary."""
    g_replay, g_dense = geometry(2, "replay"), geometry(2, "dense")
    sc = lambda g: Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="pr53324")  # noqa: E731
    t0 = time.monotonic()
    # attention tail object (0, 52) gone on rank 1: attention keeps [0, 32), no Mamba state below -> 0
    totals = run(master, [sc(g_replay)], tmp_path / "a", "evict-att", [{1: [(0, 52)]}])
    assert totals["minus704"] == 1 and totals["bytes_wrong"] == 0 and totals["safe_below_hit"] == 2
    # vLLM 0.33.0's store rule: the attention tail is keyed at the checkpoint 52 plus the proof margin, H_56
    shipped = Scenario(geometry=g_replay, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="vllm-0.33.0")
    totals = run(master, [shipped], tmp_path / "c", "evict-att-vllm", [{1: [(0, 56)]}])
    assert totals["minus704"] == 1 and totals["bytes_wrong"] == 0 and totals["safe_below_hit"] == 2
    # Mamba state at h = 48 gone on rank 0 under dense retention: fall back to the checkpoint at 32
    totals = run(master, [sc(g_dense)], tmp_path / "b", "evict-mamba", [{0: [(1, 48)]}])
    assert totals["minus704"] == 1 and totals["bytes_wrong"] == 0 and totals["bytes_compared"] > 0
    assert time.monotonic() - t0 < 120


def test_store_full_is_not_cached(tmp_path):
    """Puts answered -200 (segment full) mean 'not cached': no error, every load still exact, time bounded."""
    g = geometry(2, "dense")
    scs = [Scenario(geometry=g, prompt=150, stored=(StoredRequest(prompt=150, shared=150),), rules="pr53324") for _ in range(10)]
    with cluster.running_master(str(tmp_path)) as m:
        # 2 MiB per attention shard: ~50 MiB of puts per rank into the smallest segment Mooncake accepts (16 MiB)
        job = attrs.evolve(build_job(m.address, scs, "full"), width=32768, segment_bytes=16 << 20)
        t0 = time.monotonic()
        ranks = cluster.run_ranks(job, 2, timeout_s=180, workdir=str(tmp_path))
        elapsed = time.monotonic() - t0
    full = sum(st["store_full"] for r in ranks for s in r["scenarios"] for st in s["stores"])
    failed = [f for r in ranks for s in r["scenarios"] for st in s["stores"] for f in st["failed"]]
    print(f"store full: {full} puts answered -200, other failures {failed}, {elapsed:.1f} s")
    assert full > 0 and not failed
    for k in range(len(scs)):
        hits = {r["scenarios"][k]["hit"] for r in ranks}
        assert len(hits) == 1  # ranks agree
        for r in ranks:
            s = r["scenarios"][k]
            assert s["bytes_wrong"] == 0 and s["safe"] <= s["hit"]
    assert elapsed < 180


def _wait_for(paths, timeout=60):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"ranks never reached {paths}"
        time.sleep(0.05)


def test_master_killed_during_load_and_restarted(tmp_path):
    """The master dies after the lookup and comes back on the same port: loads fail (-900 / -704), nothing wrong
    is used, every earlier key is gone (a retry finds no hit), and it all ends in bounded time."""
    g = geometry(2, "dense")
    sc = Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="pr53324")
    sync = tmp_path / "sync"
    sync.mkdir()
    m = cluster.start_master(str(tmp_path))
    state = {"master": m}

    def kill_and_restart(pids):
        _wait_for([sync / "ready0", sync / "ready1"])
        state["master"].restart()  # SIGKILL by PID, then a fresh master on the same leased ports
        (sync / "go").touch()

    try:
        job = build_job(m.address, [sc], "kill-master")
        job = with_faults(job, 0, hold_before_load=str(sync), relookup=True)
        t0 = time.monotonic()
        ranks = cluster.run_ranks(job, 2, timeout_s=240, workdir=str(tmp_path / "job"), during=kill_and_restart)
        elapsed = time.monotonic() - t0
    finally:
        state["master"].stop()
    codes = sorted({rc for r in ranks for rc in r["scenarios"][0]["load"]["results"]})
    print(f"master killed: load codes {codes}, {elapsed:.1f} s")
    for r in ranks:
        s = r["scenarios"][0]
        assert s["hit"] > 0 and all(rc < 0 for rc in s["load"]["results"])  # every key lost with the master
        assert set(s["load"]["results"]) <= {RPC_FAIL, RPC_TIMEOUT, OBJECT_NOT_FOUND, TRANSFER_FAIL}
        assert s["safe"] == 0 and s["bytes_wrong"] == 0 and s["relookup_hit"] == 0
    assert elapsed < 240


def test_rank_process_killed(tmp_path):
    """A rank process dies (SIGKILL) after storing: the survivors fail fast instead of hanging, every process is
    gone, and a fresh set of ranks finds no hit (the dead client's segment and shards are gone: E needs every rank)."""
    g = geometry(2, "replay")
    sc = Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="pr53324")
    with cluster.running_master(str(tmp_path)) as m:
        job = build_job(m.address, [sc], "kill-rank")
        job = with_faults(job, 0, crash_after_store=1)
        seen = {}
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="rank"):
            cluster.run_ranks(job, 2, timeout_s=120, workdir=str(tmp_path / "a"),
                              env={"TORCH_GLOO_TIMEOUT": "20"}, during=lambda pids: seen.update(pids=pids))
        assert time.monotonic() - t0 < 120
        for pid in seen["pids"]:  # nothing left running
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        time.sleep(3)  # client_ttl=2: the master drops the dead client's segment
        job2 = build_job(m.address, [Scenario(geometry=g, prompt=57, stored=())], "kill-rank")
        job2 = attrs.evolve(job2, scenarios=(attrs.evolve(job2.scenarios[0], prefix=job.scenarios[0].prefix,
                                                                    seed=job.scenarios[0].seed),))
        ranks = cluster.run_ranks(job2, 2, timeout_s=120, workdir=str(tmp_path / "b"))
    for r in ranks:
        s = r["scenarios"][0]
        assert s["hit"] == 0 and s["bytes_wrong"] == 0


def test_lease_blocks_removal(tmp_path):
    """The lookup's existence check grants a lease: a non-forced removal right after it answers -706, the object
    stays, and the load the spec predicts succeeds byte-exact."""
    g = geometry(2, "replay")
    sc = Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),), rules="pr53324")
    m = cluster.start_master(str(tmp_path), lease_ttl_ms=10_000)
    try:
        # an unforced removal on rank 0: the spec expects nothing removed (the lease keeps it)
        job = with_faults(build_job(m.address, [sc], "lease"), 0, evict_after_lookup_unforced={0: ((0, 52),)})
        ranks = cluster.run_ranks(job, 2, timeout_s=120, workdir=str(tmp_path / "job"))
    finally:
        m.stop()
    assert ranks[0]["scenarios"][0]["evicted_rc"] == [OBJECT_HAS_LEASE]
    totals = compare([sc], job, ranks)
    assert totals["minus704"] == 0 and totals["bytes_wrong"] == 0 and totals["bytes_compared"] > 0
