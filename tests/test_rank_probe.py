"""Presence means every rank's shard exists, whichever way a rank asks: by MIN-all-reducing its own exist bits (a
process group) or by probing every rank's keys itself (the load harness's ranks, RankEngine probe_all_ranks)."""

from __future__ import annotations

import torch

from kvspec.impl.engine import RankEngine, render_rank_key
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import compute_hash_chain

from .support.fakes import FakeMooncake

G = Geometry(unit=4, groups=(Group(kind="attention", block_size=8, eagle=True), Group(kind="mamba", block_size=8)),
             parallel=Parallel(dcp=4))


def test_a_rank_without_collectives_probes_every_ranks_shard():
    chain = compute_hash_chain(list(range(64)), G.unit)
    store = FakeMooncake()
    whole, partial = (0, 32), (1, 32)  # every rank's shard of one object; the other lacks rank 3's
    keys = [render_rank_key(G, r, g, t, chain) for g, t in (whole, partial) for r in range(4) if (g, r) != (1, 3)]
    store.put(keys, [0] * len(keys), [0] * len(keys))
    for rank in range(4):
        probe = RankEngine(G, rank, store, torch.device("cpu"), probe_all_ranks=True).probe_everywhere
        assert probe([whole, partial], chain) == {whole}
    # the key rendering is the engine's own: rank r's engine names the key render_rank_key names for r
    assert [RankEngine(G, r, None, torch.device("cpu")).key(*whole, chain) for r in range(4)] == keys[:4]
    # a rank that asked only for its own shard, with no all-reduce, would take the partial object as present
    own = RankEngine(G, 0, store, torch.device("cpu")).probe_everywhere
    assert own([whole, partial], chain) == {whole, partial}
