"""Stateful, on real parts: the spec model against D real rank processes on a real mooncake_master."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvspec.impl.engine import RankEngine
from kvspec.impl.job import Job
from kvspec.spec.failure import compute_retry_cap, compute_safe_boundary
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import compute_hash_chain
from kvspec.spec.lookup import compute_lookup
from kvspec.spec.model import ModelStore, apply_evict, apply_put, compute_present_in_chain
from kvspec.spec.store import compute_store_boundaries

from .conftest import require
from .support.universe import prompts, spec_expectation, tokens_of

pytestmark = [pytest.mark.live, pytest.mark.stateful]
cluster = require("kvspec.impl.cluster")
GEOMETRY = Geometry(unit=4, groups=(Group(kind="attention", block_size=8, eagle=True), Group(kind="mamba", block_size=8)),
                    parallel=Parallel(dcp=2), retention="dense")
TOTALS: Counter = Counter()
IDS = itertools.count()


class SpecVsRankProcesses(RuleBasedStateMachine):
    """Rank processes stay up across examples (class attribute); each example has its own key prefix."""

    ranks: cluster.RankServers | None = None

    @initialize()
    def setup(self):
        self.g = GEOMETRY
        self.prefix = f"rp{next(IDS)}"
        self.local = [RankEngine(self.g, r, None, torch.device("cpu"), width=4, model="kvspec-live",
                                 cache_prefix=self.prefix) for r in range(self.g.parallel.dcp)]
        self.expected = ModelStore()
        self.keys: dict[tuple[bytes, int, int], str] = {}

    @rule(p=prompts)
    def store(self, p):
        toks = tokens_of(*p)
        chain = compute_hash_chain(toks, self.g.unit)
        for r in range(self.g.parallel.dcp):
            ans = self.ranks.call(r, {"op": "store", "tokens": toks, "prefix": self.prefix})
            assert not ans["failed"]
        shards = []
        for gid, t in compute_store_boundaries(self.g, len(toks)):
            h = chain[t // self.g.unit - 1]
            for eng in self.local:
                self.keys[(h, gid, eng.rank)] = eng.key(gid, t, chain)
                shards.append((h, gid, eng.rank))
        self.expected = apply_put(self.expected, shards)
        TOTALS["store"] += 1

    @precondition(lambda self: bool(self.expected.shards))
    @rule(data=st.data())
    def evict(self, data):
        shard = data.draw(st.sampled_from(sorted(self.expected.shards)))
        assert self.ranks.call(shard[2], {"op": "remove", "keys": [self.keys[shard]]})["rc"] == [0]
        self.expected = apply_evict(self.expected, [shard])
        TOTALS["evict"] += 1

    @rule(p=prompts, fail=st.lists(st.booleans(), min_size=6, max_size=6))
    def lookup_and_load(self, p, fail):
        toks = tokens_of(*p)
        n, u, d = len(toks), self.g.unit, self.g.parallel.dcp
        chain, E, h, tails, plan = spec_expectation(self.g, self.expected, toks)
        failing = [(e, chain[e.key_boundary // u - 1]) for e, bad in zip(plan, fail) if bad]
        fail_keys = [self.keys[(hh, e.group, 0)] for e, hh in failing]
        answers = self.ranks.call_all({"op": "lookup_load", "tokens": toks, "prefix": self.prefix,
                                       "fail_keys": {"0": fail_keys}})
        self.expected = apply_evict(self.expected, [(hh, e.group, 0) for e, hh in failing])
        ok = [not (k < len(fail) and fail[k]) for k in range(len(plan))]
        safe = compute_safe_boundary(self.g, E, h, plan, ok)
        for a in answers:
            assert a["hit"] == h and [tuple(t) for t in a["tails"]] == [tuple(t) for t in tails]
            assert [tuple(x) for x in a["plan"]] == [(e.group, e.block, e.key_boundary) for e in plan]
            assert a["ok"] == ok and a["safe"] == safe and a["bytes_wrong"] == 0
            TOTALS["bytes"] += a["bytes_compared"]
            TOTALS["draft_lookahead_bytes"] += a["draft_lookahead_bytes"]
        if not all(ok):
            TOTALS["failures"] += 1
            E2 = compute_present_in_chain(self.expected, chain, u, len(self.g.groups), d)
            cap = compute_retry_cap(1, safe)
            again = self.ranks.call_all({"op": "lookup_load", "tokens": toks, "prefix": self.prefix, "cap": cap})
            want = compute_lookup(self.g, E2, n, cap=cap).hit_length
            assert all(a["hit"] == want <= safe and a["bytes_wrong"] == 0 for a in again)
        TOTALS["lookup"] += 1

    @invariant()
    def store_matches_model(self):
        if not getattr(self, "keys", None):
            return
        for r in range(self.g.parallel.dcp):
            mine = sorted((s, k) for s, k in self.keys.items() if s[2] == r)
            ex = self.ranks.call(r, {"op": "exist", "keys": [k for _, k in mine]})["exist"]
            assert all((e == 1) == (s in self.expected.shards) for (s, _), e in zip(mine, ex))


def test_stateful_rank_processes(master, tmp_path):
    job = Job(master=master.address, model="kvspec-live", width=4, geometry=GEOMETRY)
    SpecVsRankProcesses.ranks = cluster.RankServers(job, GEOMETRY.parallel.dcp, str(tmp_path))
    try:
        run_state_machine_as_test(SpecVsRankProcesses, settings=settings(
            max_examples=20, stateful_step_count=15, deadline=None, suppress_health_check=list(HealthCheck)))
    finally:
        SpecVsRankProcesses.ranks.close()
    print(f"stateful (rank processes, real store): {dict(TOTALS)}")
    assert TOTALS["lookup"] > 0
