"""Stateful: the spec model against the implementation over store / evict / lookup+load / failure steps."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec.checks.conform.adapters import compute_impl_store_rule
from kvspec.impl.cold_check import compare_with_cold
from kvspec.impl.engine import RankEngine, RequestKV
from kvspec.impl.lookup import HybridLookup
from kvspec.spec.failure import compute_retry_cap, compute_safe_boundary
from kvspec.spec.geometry import Geometry, Group, Parallel
from kvspec.spec.keys import compute_lookahead_chain
from kvspec.spec.lookup import compute_lookup
from kvspec.spec.model import ModelStore, apply_evict, apply_put, compute_present_in_chain
from kvspec.spec.rules import compute_lookahead, compute_rule_geometry, get_rules
from kvspec.spec.schedule import BLOCK_SCHEDULE, Schedule
from kvspec.spec.store import compute_rule_store

from .support.fakes import FakeMooncake
from .support.universe import prompts, spec_expectation, tokens_of

TOTALS: Counter = Counter()
RUN_IDS = itertools.count()
CPU = torch.device("cpu")


class SpecVsImpl(RuleBasedStateMachine):
    """One geometry and rule set; D rank engines over one fake store; the spec's ModelStore predicts its contents."""

    @initialize(u=st.sampled_from([1, 2, 4]), qa=st.integers(1, 4), qm=st.integers(1, 4), d=st.sampled_from([1, 2, 4]),
                eagle=st.booleans(), draft=st.booleans(), dense=st.booleans(),
                rules=st.sampled_from(["pr53324", "vllm-0.33.0", "vllm-0.34.0"]))
    def setup(self, u, qa, qm, d, eagle, draft, dense, rules):
        groups = [Group(kind="attention", block_size=qa * u, eagle=eagle)]
        if draft:
            groups.append(Group(kind="attention", block_size=qa * u))
        groups.append(Group(kind="mamba", block_size=qm * u))
        self.g = Geometry(unit=u, groups=tuple(groups), parallel=Parallel(dcp=d),
                          retention="dense" if dense else "replay")
        self.rules, rs = rules, get_rules(rules)
        self.rg, self.lam = compute_rule_geometry(rs, self.g), compute_lookahead(rs, self.g)
        self.stores = self.make_stores(d)
        self.prefix = f"sm{next(RUN_IDS)}"
        self.engines = [RankEngine(self.g, r, self.stores[r], CPU, width=4, cache_prefix=self.prefix,
                                   store_rule=compute_impl_store_rule(rules), lookahead=self.lam)
                        for r in range(d)]
        self.expected = ModelStore()
        self.keys: dict[tuple[bytes, int, int], str] = {}
        self.steps = Counter()

    def _key(self, h: bytes, g: int, r: int) -> str:
        return self.keys[(h, g, r)]

    @rule(p=prompts, data=st.data())
    def store(self, p, data):
        toks = tokens_of(*p)
        chain = compute_lookahead_chain(toks, self.g.unit, self.lam)
        # under a vLLM store rule the prefill's steps end where a drawn schedule ends them (any chunk ends: budgets,
        # preemption, concurrency), so only some Mamba states exist; the spec reads them as a trace
        ends, schedule = None, BLOCK_SCHEDULE
        if self.rules != "pr53324" and len(toks) > 1 and data.draw(st.booleans(), label="chunked"):
            ends = (*sorted(data.draw(st.sets(st.integers(1, len(toks) - 1), max_size=6), label="chunk ends")),
                    len(toks))
            schedule = Schedule(ends=ends)
            self.steps["scheduled stores"] += 1
        for eng in self.engines:
            kv = RequestKV(self.g, len(toks), eng.width, CPU)
            eng.prefill(toks, kv)
            eng.store_request(toks, chain, kv, ends)
        shards = []
        for gid, t in compute_rule_store(get_rules(self.rules), self.g, len(toks), schedule):
            for eng in self.engines:
                h = chain[t // self.g.unit - 1]
                self.keys[(h, gid, eng.rank)] = eng.key(gid, t, chain)
                shards.append((h, gid, eng.rank))
        self.expected = apply_put(self.expected, shards)
        self.steps["store"] += 1

    @precondition(lambda self: bool(self.expected.shards))
    @rule(data=st.data(), all_ranks=st.booleans())
    def evict(self, data, all_ranks):
        h, g, r = data.draw(st.sampled_from(sorted(self.expected.shards)))
        victims = [(h, g, x) for x in range(self.g.parallel.dcp)] if all_ranks else [(h, g, r)]
        victims = [v for v in victims if v in self.expected.shards]
        for v in victims:
            assert self.stores[v[2]].remove(self._key(*v), force=True) == 0
        self.expected = apply_evict(self.expected, victims)
        self.steps["evict"] += 1

    @rule(p=prompts, fail=st.lists(st.booleans(), min_size=8, max_size=8))
    def lookup_and_load(self, p, fail):
        toks = tokens_of(*p)
        n, u, d = len(toks), self.g.unit, self.g.parallel.dcp
        chain, E, spec_h, spec_tails, plan = spec_expectation(self.g, self.expected, toks, self.rules)

        def probe(objs):
            bits = [eng.store.exist([eng.key(g, t, chain) for g, t in objs]) for eng in self.engines]
            return {o for j, o in enumerate(objs) if all(b[j] == 1 for b in bits)}

        lk = HybridLookup(self.g, n, lookahead=self.lam)
        h, tails = lk.run(probe)
        assert (h, tuple(tails)) == (spec_h, spec_tails), f"impl {h} {tails} != spec {spec_h} {spec_tails}"
        # inject per-key failures on rank 0 for some planned blocks
        failing = {self.engines[0].key(e.group, e.key_boundary, chain) for e, bad in zip(plan, fail) if bad}
        self.inject(failing, chain)
        results, colds = [], []
        for eng in self.engines:
            cold = RequestKV(self.g, n, eng.width, CPU)
            ld = eng.load(chain, h, tails, cold)
            assert list(ld.plan) == [(e.group, e.block, e.key_boundary) for e in plan]
            for key, rc in zip(ld.keys, ld.results):  # no load key outside the store
                assert rc >= 0 or key in failing, f"{key} -> {rc}"
            results.append(ld)
            colds.append(cold)
        self.heal()
        ok = [all(r.loaded[k] for r in results) for k in range(len(plan))]
        spec_safe = compute_safe_boundary(self.rg, E, spec_h, plan, ok)
        impl_safe = self.engines[0].safe_boundary(h, results[0].plan, ok, probe)
        assert impl_safe == spec_safe, f"safe boundary impl {impl_safe} != spec {spec_safe}"
        for eng, ld, cold in zip(self.engines, results, colds):
            cmp_, wrong, lookahead = compare_with_cold(eng, toks, spec_safe, cold, ld.plan, ok, mamba=spec_safe == h)
            assert wrong == 0
            self.steps["bytes"] += cmp_
            self.steps["draft_lookahead_bytes"] += lookahead
        if not all(ok):
            self.steps["failures"] += 1
            cap = compute_retry_cap(1, spec_safe)
            E = compute_present_in_chain(self.expected, chain, u, len(self.g.groups), d)  # after the injection
            again = compute_lookup(self.rg, E, n, cap=cap, lookahead=self.lam).hit_length
            lk2 = HybridLookup(self.g, n, cap=cap, lookahead=self.lam)
            assert lk2.run(probe)[0] == again <= spec_safe
        self.steps["lookup"] += 1

    def teardown(self):
        if hasattr(self, "steps"):
            TOTALS.update(self.steps)
            TOTALS["runs"] += 1
            TOTALS[f"runs under {self.rules}"] += 1

    @invariant()
    def store_matches_model(self):
        if hasattr(self, "stores"):
            self.check_store()

    # -------------------------------------------------------------- store backends
    def make_stores(self, d):
        self.fake = FakeMooncake()
        return [self.fake] * d

    def inject(self, keys, chain):
        self.fake.fail = set(keys)

    def heal(self):
        self.fake.fail = set()

    def check_store(self):
        assert self.fake.model == self.expected


SpecVsImpl.TestCase.settings = settings(max_examples=80, stateful_step_count=25, deadline=None,
                                        suppress_health_check=list(HealthCheck))
TestSpecVsImpl = SpecVsImpl.TestCase
TestSpecVsImpl.pytestmark = [__import__("pytest").mark.stateful]


def test_stateful_report():
    """Runs after the machine (file order): the steps, faults and bytes it exercised."""
    print(f"stateful (in-memory): {dict(TOTALS)}")
    if TOTALS["runs"]:
        assert TOTALS["lookup"] > 0 and TOTALS["bytes"] > 0
    if TOTALS["runs"] >= 20:  # the default rule sets meet the implementation, not only the PR's
        assert sum(TOTALS[f"runs under {r}"] > 0 for r in ("pr53324", "vllm-0.33.0", "vllm-0.34.0")) >= 2
        assert TOTALS["scheduled stores"] > 0  # and the schedule: some stores left Mamba states only at chunk ends


class SpecVsImplRealStore(SpecVsImpl):
    """The same machine on a real mooncake_master: one in-process client per rank; failures are forced removals."""

    clients: list = []

    def make_stores(self, d):
        return self.clients[:d]

    def inject(self, keys, chain):
        for key in keys:  # the object disappears between lookup and load (one rank's shard)
            assert self.engines[0].store.remove(key, force=True) == 0
        gone = [s for s, k in self.keys.items() if k in keys]
        self.expected = apply_evict(self.expected, gone)

    def heal(self):
        pass

    def check_store(self):
        items = sorted(self.keys.items())
        for r, eng in enumerate(self.engines):
            mine = [(s, k) for s, k in items if s[2] == r]
            ex = eng.store.exist([k for _, k in mine])
            assert all((e == 1) == (s in self.expected.shards) for (s, _), e in zip(mine, ex))


@pytest.mark.live
def test_stateful_real_store(master):
    """Fewer steps, real store: D clients of one master (in-process ranks), spec model alongside."""
    from hypothesis.stateful import run_state_machine_as_test

    from kvspec.impl.mooncake_store import MooncakeKV
    SpecVsImplRealStore.clients = [MooncakeKV(master.address, segment_bytes=64 << 20) for _ in range(4)]
    try:
        before = TOTALS["lookup"]
        run_state_machine_as_test(SpecVsImplRealStore, settings=settings(
            max_examples=12, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)))
        print(f"stateful (real store): {TOTALS['lookup'] - before} lookups, totals {dict(TOTALS)}")
    finally:
        for c in SpecVsImplRealStore.clients:
            c.close()
