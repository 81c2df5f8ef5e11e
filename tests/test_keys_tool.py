"""kvspec keys parse / check: a key dump grouped by object, the ranks that lack each one, the spec on E."""

from __future__ import annotations

import json

import attrs
import pytest

from kvspec.checks.cli.keys_tool import compute_engine_chain, compute_key_report, format_key_report, parse_key_vllm
from kvspec.checks.cli.main import main
from kvspec.spec.keys import KEY_GRAMMARS, StoreKey, compute_hash_at, compute_hash_chain
from kvspec.spec.presets import get_preset
from kvspec.spec.scenario import Scenario, StoredRequest, compute_stored_objects


def dump(rules: str, tokens: list[int], grammar: str = "kvspec", drop: tuple = (), dcp: int | None = None) -> list[str]:
    """Return the keys a real deployment would hold after storing `tokens` (minus the `drop` rank shards): kvspec's
    chain in kvspec's grammar, vLLM's sha256 chain (its default prefix_caching_hash_algo) in vLLM's."""
    g = get_preset("kimi-k3-dcp8")
    if dcp is not None:
        g = attrs.evolve(g, parallel=attrs.evolve(g.parallel, dcp=dcp))
    sc = Scenario(geometry=g, prompt=len(tokens), stored=(StoredRequest(prompt=len(tokens), shared=len(tokens)),),
                  rules=rules)
    chain = compute_hash_chain(tokens, g.unit) if grammar == "kvspec" else compute_engine_chain(tokens, g.unit)
    render = KEY_GRAMMARS[grammar]
    return [render(StoreKey(model="kimi-k3", tp_rank=r, pcp_rank=0, dcp_rank=r, pp_rank=0, group=gid,
                            hash_hex=compute_hash_at(chain, g.unit, t).hex()))
            for gid, t, r in sorted(compute_stored_objects(sc)) if (gid, t, r) not in drop]


TOKENS = [(31 * i + 7) % 50_000 for i in range(15000)]


@pytest.mark.parametrize("grammar", ["kvspec", "vllm-0.33.0"])
def test_complete_dump_reproduces_the_worked_example(grammar):
    rep = compute_key_report(get_preset("kimi-k3-dcp8"), dump("vllm-0.33.0", TOKENS, grammar), grammar, TOKENS)
    assert rep["bad_lines"] == [] and rep["unmatched_hashes"] == 0
    assert all(o["in_present_set"] for o in rep["objects"])
    assert sorted((o["group"], o["boundary"]) for o in rep["objects"]) == [(0, 12288), (0, 14976), (1, 14848)]
    out = rep["outcome"]
    assert out["hit_length"] == 14848 and all(e["present"] for e in out["load"])


def test_a_rank_missing_one_object_is_named_and_the_hit_falls():
    keys = dump("vllm-0.33.0", TOKENS, drop={(1, 14848, 5)})  # rank 5 lost the Mamba checkpoint
    rep = compute_key_report(get_preset("kimi-k3-dcp8"), keys + ["not a key", ""], "kvspec", TOKENS)
    mamba = next(o for o in rep["objects"] if o["group"] == 1)
    assert mamba["missing_ranks"] == [5] and not mamba["in_present_set"]
    assert rep["bad_lines"][0]["line"] == len(keys) + 1 and rep["outcome"]["hit_length"] < 14848


def test_cli_check_and_parse(tmp_path, capsys):
    f, t = tmp_path / "keys.txt", tmp_path / "tokens.json"
    f.write_text("\n".join(dump("pr53324", TOKENS, drop={(0, 12288, 3)})) + "\n")
    t.write_text(json.dumps(TOKENS))
    assert main(["keys", "check", "--keys", str(f), "--preset", "kimi-k3-dcp8", "--tokens", str(t),
                 "--rules", "pr53324"]) == 0
    out = capsys.readouterr().out
    assert "group 0 t=12288: ranks [0, 1, 2, 4, 5, 6, 7] — NOT in E: ranks [3] lack it" in out and "hit 0" in out
    key = dump("vllm-0.33.0", TOKENS)[0]
    assert main(["keys", "parse", key, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "kimi-k3"
    with pytest.raises(SystemExit) as exc:
        main(["keys", "parse", key.replace("pp_rank:0", "pp_rank:x")])
    assert exc.value.code == 2 and "pp_rank" in capsys.readouterr().err


def test_vllm_grammar_lists_every_reading_of_an_ambiguous_head():
    k = "a@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + "0" * 64
    key, splits = parse_key_vllm(k)
    assert key.model == "a@m" and splits == [("", "a@m"), ("a", "m")]


def test_a_dump_that_maps_nothing_or_does_not_fit_says_so():
    """Wrong token ids (or hash algorithm, seed, salt) and a dump of another DCP size are named, not silently
    reported as 'hit 0' or 'every rank lacks everything'."""
    g, keys = get_preset("kimi-k3-dcp8"), dump("vllm-0.33.0", TOKENS, "vllm-0.33.0")
    wrong = [t + 1 for t in TOKENS]
    rep = compute_key_report(g, keys, "vllm-0.33.0", wrong)
    assert rep["unmatched_hashes"] == len(rep["objects"]) and rep["outcome"]["hit_length"] == 0
    assert "none of the 3 objects' hashes is a boundary" in format_key_report(rep)
    rep = compute_key_report(g, keys, "vllm-0.33.0", TOKENS, hash_algo="kvspec")  # the wrong chain for this dump
    assert rep["unmatched_hashes"] == 3 and "--hash-algo" in rep["warnings"][0]
    rep = compute_key_report(g, keys, "vllm-0.33.0", TOKENS, cache_salt="tenant-7")  # salted: no match either
    assert rep["unmatched_hashes"] == 3
    rep = compute_key_report(g, dump("vllm-0.33.0", TOKENS, "vllm-0.33.0", dcp=4), "vllm-0.33.0", TOKENS)
    assert "DCP ranks [0, 1, 2, 3] only" in format_key_report(rep)
    rep = compute_key_report(attrs.evolve(g, parallel=attrs.evolve(g.parallel, dcp=2)), keys, "vllm-0.33.0")
    assert "DCP ranks up to 7" in format_key_report(rep)


def test_vllm_chain_is_vllms_default_hash():
    """vLLM's default prefix-caching hash, stated in kvspec's words (tests/test_vllm_conformance.py checks the same
    chain against vLLM's own hash_block_tokens): SHA-256 of the pickled (parent, unit tokens, extra keys)."""
    import hashlib
    import pickle
    root = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    first = hashlib.sha256(pickle.dumps((root, (1, 2), None), protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert compute_engine_chain([1, 2, 3, 4], 2)[0] == first
    assert len(compute_engine_chain([1, 2, 3, 4], 2, lookahead=1)) == 1  # the 2nd unit's next token does not exist
    with pytest.raises(Exception, match="PYTHONHASHSEED"):
        compute_engine_chain([1, 2], 1, "xxhash")
