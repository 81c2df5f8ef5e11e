"""The transfer bench runs end to end on real rank processes and a real master (figures printed, not judged)."""

from __future__ import annotations

import pytest

from .conftest import require

pytestmark = pytest.mark.live


def test_transfer_bench_small_layout():
    require("mooncake.store")
    from kvspec.checks.bench.runner import LayerLayout, bench_transfer, format_bench
    lay = LayerLayout(attention_layers=1, latent=64, state_layers=1, state_heads=2, state_head_dim=16)
    r = bench_transfer(dcp=2, tokens=4096, repeats=1, layout=lay)
    print(format_bench({"transfer": [r]}))
    assert r["bytes_per_token"] == 128 and r["state_bytes_per_rank"] == 2 * 16 * 16 * 4 // 2
    assert r["iterations"] == 1 and r["put_bytes"] > 0 and r["get_bytes"] > 0
    assert r["same_bytes"]  # the implementation's load and the raw get brought the same bytes
    assert r["put_ratio"] > 0 and r["get_ratio"] > 0


def test_lookup_bench_on_a_real_master():
    """The lookup's probes go through a real master's batch_is_exist: the same hit and tails as the spec, one round for
    a resend, and both call patterns timed (figures printed, not judged)."""
    require("mooncake.store")
    from kvspec.checks.bench.runner import bench_lookup_master, format_bench
    rows = bench_lookup_master((32_768,), ("vllm-0.34.0",))
    print(format_bench({"lookup": rows}))
    (r,) = rows
    assert r["identical"] and r["rounds"] == 1 and r["hit_length"] == 32_640
    assert r["master_ms"] > 0 and r["baseline_master_ms"] > 0


def test_deadline_table_on_a_real_master():
    """The lookup-deadline table: per D both call patterns timed on a real master for the same resend (the same hit as
    the spec), vLLM's with every rank's unit-boundary keys, kvspec's with far fewer; each row says whether it passed
    the 1 s deadline, and the summary where each pattern first does (figures printed, not judged)."""
    require("mooncake.store")
    from kvspec.checks.bench.runner import bench_deadline, format_deadline
    rows = bench_deadline(dcps=(1, 2), sizes=(32_768, 65_536))
    print("\n".join(format_deadline(rows)))
    assert [(r["dcp"], r["tokens"]) for r in rows] == [(1, 32_768), (1, 65_536), (2, 32_768), (2, 65_536)]
    assert all(r["identical"] and r["probes"] < r["baseline_probes"] for r in rows)
    assert rows[2]["baseline_probes"] == 2 * rows[0]["baseline_probes"]  # every rank probes its own keys
    assert all(isinstance(r["past_deadline"], bool) and r["master_ms"] > 0 for r in rows)
    lines = format_deadline(rows)
    assert any(line.startswith("  D=1: vLLM's pattern") for line in lines)
