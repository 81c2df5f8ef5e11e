"""`--from-vllm FILE`: vLLM engine configurations mapped to geometries, and refused as vLLM refuses them.

(That vLLM's own resolution agrees with the mapping is tested in test_vllm_conformance.py.)
"""

from __future__ import annotations

import json

import pytest

from kvspec.checks.conform.vllm_config import GroupKind, compute_geometry_from_vllm
from kvspec.spec.errors import SpecError
from kvspec.spec.presets import get_preset

from .support.cli import run_cli

KIMI = {"cache_config": {"block_size": 1536, "prefix_match_unit": 128, "mamba_block_size": 1536,
                         "enable_prefix_caching": True, "prefix_cache_retention_interval": 0},
        "parallel_config": {"decode_context_parallel_size": 8},
        "speculative_config": {"method": "eagle3", "num_speculative_tokens": 3},
        "kv_transfer_config": {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"},
        "kv_cache_groups": ["mla", "kda"]}


run = run_cli  # (argv, capsys) -> (exit status, stdout, stderr)


def test_kimi_config_is_the_preset():
    m = compute_geometry_from_vllm(KIMI)
    assert m.geometry == get_preset("kimi-k3-dcp8")
    assert dict(m.provenance)["eagle"].endswith("EAGLE drop on")


def test_flat_engine_arguments_and_defaults():
    flat = {"block_size": 16, "decode_context_parallel_size": 2, "prefix_cache_retention_interval": None,
            "kv_cache_groups": [{"kind": "attention"}, {"kind": "mamba"}]}
    g = compute_geometry_from_vllm(flat).geometry
    # mamba_block_size defaults to block_size; the unit to the gcd of the spans 32 and 16; null interval: dense
    assert [(x.kind, x.block_size, x.eagle) for x in g.groups] == [("attention", 16, False), ("mamba", 16, False)]
    assert (g.unit, g.parallel.dcp, g.retention) == (16, 2, "dense")
    lone = compute_geometry_from_vllm({"block_size": 16}, (GroupKind(kind="mla"),))
    assert lone.geometry.unit == 16  # one group: the unit is its span
    dcp2 = compute_geometry_from_vllm({"block_size": 16, "decode_context_parallel_size": 2}, (GroupKind(kind="mla"),))
    assert dcp2.geometry.unit == 32  # under DCP 2 vLLM hashes every 32 tokens (u divides the span b·D, not b)


@pytest.mark.parametrize("spec,eagle", [
    ({"method": "eagle"}, True), ({"method": "mtp", "num_speculative_tokens": 2}, True),
    ({"method": "dspark"}, False), ({"method": "dflash"}, False), ({"method": "ngram"}, False),
    ({"method": "eagle3", "disable_eagle_block_drop": True}, False)])
def test_speculative_method_decides_the_eagle_drop(spec, eagle):
    cfg = {**KIMI, "speculative_config": spec}
    assert compute_geometry_from_vllm(cfg).geometry.groups[0].eagle is eagle


def test_multi_connector_holding_the_mooncake_store_is_accepted():
    kv = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector"}, {"kv_connector": "MooncakeStoreConnector"}]}}
    assert compute_geometry_from_vllm({**KIMI, "kv_transfer_config": kv}).geometry == get_preset("kimi-k3-dcp8")


@pytest.mark.parametrize("change,rule,words", [
    ({"cache_config": {**KIMI["cache_config"], "enable_prefix_caching": False}}, "vllm-config", "prefix_caching"),
    ({"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}}, "vllm-config", "not the Mooncake store"),
    ({"cache_config": {**KIMI["cache_config"], "prefix_cache_retention_interval": 4096}}, "vllm-config", "periodic"),
    ({"parallel_config": {"decode_context_parallel_size": 8, "cp_kv_cache_interleave_size": 1000}}, "vllm-config",
     "divisible"),
    ({"cache_config": {**KIMI["cache_config"], "prefix_match_unit": 100}}, "vllm-config", "Invalid|refuses"),
    ({"kv_cache_groups": []}, "vllm-config", "kv_cache_groups"),
    ({"kv_cache_groups": "attention"}, "vllm-config", "must be a list"),
    ({"kv_cache_groups": ["attention"]}, "vllm-prefix-match-unit", "single KV cache group"),
    ({"cache_config": {**KIMI["cache_config"], "block_size": "64"}}, "vllm-config", "integer"),
])
def test_refusals_name_the_rule(change, rule, words):
    import re
    with pytest.raises(SpecError) as ei:
        compute_geometry_from_vllm({**KIMI, **change})
    assert ei.value.rule == rule and re.search(words, str(ei.value)), str(ei.value)


def test_cli_explains_a_vllm_config(tmp_path, capsys):
    f = tmp_path / "vllm.json"
    f.write_text(json.dumps(KIMI))
    rc, out, _ = run(["explain", "--from-vllm", str(f), "--stored-prompt", "15000", "--prompt", "15000"], capsys)
    assert rc == 0 and "geometry from the vLLM configuration" in out and "prefix_match_unit=128" in out
    rc, out, _ = run(["explain", "--from-vllm", str(f), "--stored-prompt", "15000", "--prompt", "15000", "--json"],
                     capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["hit_length"] == 14976 and doc["from_vllm"]["mapping"][0]["field"] == "store path"  # 0.34.0
    rc, out, _ = run(["explain", "--from-vllm", str(f), "--stored-prompt", "15000", "--prompt", "15000", "--json",
                      "--rules", "vllm-0.33.0"], capsys)
    assert rc == 0 and json.loads(out)["hit_length"] == 14848
    # groups from --group KIND when the file does not list them; every other geometry flag is refused
    f.write_text(json.dumps({k: v for k, v in KIMI.items() if k != "kv_cache_groups"}))
    rc, out, _ = run(["explain", "--from-vllm", str(f), "--group", "attention", "--group", "gdn", "--prompt", "99",
                      "--stored-prompt", "99"],
                     capsys)
    assert rc == 0 and "mamba" in out
    rc, _, err = run(["explain", "--from-vllm", str(f), "--group", "attention", "--dcp", "2", "--prompt", "9"], capsys)
    assert rc == 2 and "cli-usage" in err and "--dcp" in err
    rc, _, err = run(["explain", "--from-vllm", str(f), "--prompt", "9"], capsys)
    assert rc == 2 and "vllm-config" in err and err.count("\n") == 1
    f.write_text("{not json")
    rc, _, err = run(["explain", "--from-vllm", str(f), "--prompt", "9"], capsys)
    assert rc == 2 and err.count("\n") == 1
