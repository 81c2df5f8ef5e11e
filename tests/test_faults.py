"""Fault injection on the real store and rank processes: the spec's predicted outcome, 0 wrong bytes, bounded time."""

from __future__ import annotations

import time

import pytest

from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.scenario import Scenario, StoredRequest

from .test_live import master, run  # noqa: F401 - the session master fixture

pytestmark = [pytest.mark.live, pytest.mark.faults]
cluster = pytest.importorskip("kvspec.impl.cluster")


def geometry(dcp: int, retention: str) -> Geometry:
    return Geometry(unit=4, groups=(Group(kind="attention", block_size=16, eagle=True),
                                    Group(kind="mamba", block_size=16)),
                    parallel=Parallel(dcp=dcp), retention=retention)


def test_eviction_between_lookup_and_load(master, tmp_path):  # noqa: F811
    """One rank's shard removed after the lookup confirmed it: -704 at load, closure to the spec's safe boundary."""
    g_replay, g_dense = geometry(2, "replay"), geometry(2, "dense")
    sc = lambda g: Scenario(geometry=g, prompt=57, stored=(StoredRequest(prompt=57, shared=57),))  # noqa: E731
    t0 = time.monotonic()
    # attention tail object (0, 52) gone on rank 1: attention keeps [0, 32), no Mamba state below -> 0
    totals = run(master, [sc(g_replay)], tmp_path / "a", "evict-att", [{"1": [[0, 52]]}])
    assert totals["minus704"] == 1 and totals["bytes_wrong"] == 0 and totals["safe_below_hit"] == 2
    # Mamba state at h = 48 gone on rank 0 under dense retention: fall back to the checkpoint at 32
    totals = run(master, [sc(g_dense)], tmp_path / "b", "evict-mamba", [{"0": [[1, 48]]}])
    assert totals["minus704"] == 1 and totals["bytes_wrong"] == 0 and totals["bytes_compared"] > 0
    assert time.monotonic() - t0 < 120


def test_store_full_is_not_cached(tmp_path):
    """Puts answered -200 (segment full) mean 'not cached': no error, every load still exact, time bounded."""
    from .live import build_job
    g = geometry(2, "dense")
    scs = [Scenario(geometry=g, prompt=150, stored=(StoredRequest(prompt=150, shared=150),)) for _ in range(6)]
    with cluster.running_master(str(tmp_path)) as m:
        job = build_job(m.address, scs, "full")
        job["width"] = 16384  # 1 MiB per attention shard
        job["segment_bytes"] = 16 << 20  # the smallest segment Mooncake accepts: fills after a few requests
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
