"""The draft-lookahead hazard, pinned as an executable example (found by the stateful test; see README).

Every key is right and every byte of the target groups matches, yet the draft (EAGLE) KV at the last
position of the block keyed H_97 was written by a request whose prompt ended at 97: it saw the sampled
token, not token 97. A longer request that shares [0, 120) loads it. The spec's rules allow this today;
this test fails the day they stop allowing it, so the rule change and the test move together.
"""

from __future__ import annotations

import torch

from kvspec.impl.cold_check import compare_with_cold
from kvspec.impl.engine import RankEngine, RequestKV
from kvspec.impl.lookup import HybridLookup
from kvspec.impl.worker import make_tokens
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import compute_hash_chain

from .support.fakes import FakeMooncake


def test_draft_kv_of_a_shorter_writer_is_loaded_under_a_correct_key():
    g = Geometry(unit=1, groups=(Group(kind="attention", block_size=1, eagle=True), Group(kind="mamba", block_size=1)),
                 parallel=Parallel(dcp=1), retention="replay")
    store = FakeMooncake()
    eng = RankEngine(g, 0, store, torch.device("cpu"), width=4)
    base = make_tokens(1, 120)
    for n in (97, 120):  # the shorter request is stored first: first writer wins for H_1..H_97
        toks = base[:n]
        kv = RequestKV(g, n, 4, torch.device("cpu"))
        eng.prefill(toks, kv)
        eng.store_request(toks, compute_hash_chain(toks, 1), kv)
    chain = compute_hash_chain(base, 1)
    lk = HybridLookup(g, 120)
    h, tails = lk.run(lambda objs: {o for o, e in zip(objs, store.exist([eng.key(x, t, chain) for x, t in objs]))
                                    if e == 1})
    assert h == 119
    cold = RequestKV(g, 120, 4, torch.device("cpu"))
    ld = eng.load(chain, h, tails, cold)
    assert not ld.failed
    compared, wrong, lookahead = compare_with_cold(eng, base, h, cold, ld.plan, ld.loaded)
    assert wrong == 0  # every other byte, target and Mamba, is exact
    assert lookahead == 4 * 4  # exactly one position (96, the end of block H_97) of the draft group differs
