"""The efficiency theorems in Z3 (MAX-HIT, BEST, MONO-PREFIX, MONO-EVICT): proved where the rule set uses the whole
cache, refuted with a counterexample the spec itself shows where it does not, and able to fail."""

from __future__ import annotations

from .conftest import require

require("z3")

import attrs  # noqa: E402

from kvspec.checks.verify import link as L  # noqa: E402
from kvspec.checks.verify import prove as P  # noqa: E402
from kvspec.checks.verify.closed_form import Params  # noqa: E402
from kvspec.checks.verify.prove import compute_theorems, prove  # noqa: E402

LOOKAHEAD = "@vllm-0.33.0-lookahead"
KINDS = (*P.EFFICIENCY_STEPS, *P.EFFICIENCY_CLAIMS)


def _theorem(name):
    return next(t for t in compute_theorems() if t.name == name)


def test_every_rule_set_with_a_closed_form_has_the_efficiency_theorems():
    names = {t.name for t in compute_theorems()}
    for at in ("", "@vllm-0.33.0", LOOKAHEAD):
        for kind in KINDS:
            assert (kind if kind.startswith("LEMMA") else f"{kind}/z3") + at in names
    assert _theorem("MONO-EVICT/z3@vllm-0.33.0").expected == "refuted"
    assert _theorem("MAX-HIT/z3").rests_on.startswith("LEMMA-MAMBA; LEMMA-ATT-MAX; LEMMA-MAMBA-MAX; LEMMA-BEST-TOP")


def test_lookahead_uses_the_whole_cache_for_every_u_q_d():
    for kind in KINDS:
        th = _theorem((kind if kind.startswith("LEMMA") else f"{kind}/z3") + LOOKAHEAD)
        v = prove(th)
        assert v.ok and v.answer == "proved", (th.name, v.answer, v.reason)


def test_max_hit_fails_for_a_lookup_one_unit_short(monkeypatch):
    real = P.compute_closed_form

    def short(ops, x, rule="pr53324", cap=None, name_reaches=False):
        cf, att, mam = real(ops, x, rule, cap, name_reaches)
        return attrs.evolve(cf, hit=ops.max(cf.hit - 1, 0)), att, mam

    monkeypatch.setattr(P, "compute_closed_form", short)
    v = prove(_theorem("MAX-HIT/z3" + LOOKAHEAD))
    assert v.answer == "refuted" and not v.ok and v.model is not None  # the model replayed on ints


def test_refutations_are_shown_by_the_spec_itself():
    """BEST and MONO-EVICT under vLLM 0.33.0's rules: the model replays on the executable spec (h below its physical
    best; a hit the eviction raises), and the row carries the kvspec explain commands that show it."""
    for name in ("BEST/z3@vllm-0.33.0", "MONO-EVICT/z3"):
        th = _theorem(name)
        v = prove(th)
        assert v.ok and v.answer == "refuted", (name, v.answer, v.reason)
        assert th.replay(v.model)
        commands = th.explain(v.model).split(" ; ")
        assert all(c.startswith("kvspec explain") for c in commands)
        assert len(commands) == (2 if name.startswith("MONO-EVICT") else 1)
        assert "--evict" in commands[-1] or len(commands) == 1


def test_a_model_where_the_claim_holds_is_not_a_counterexample():
    """A replay answers whether the claim fails at the model: an identical resend under hash lookahead hits its best
    (t = 5 is no servable boundary above it), so this model is no counterexample."""
    replay = P._replay_efficiency("BEST", "vllm-0.33.0-lookahead")
    x = {"u": 1, "q": 1, "d": 2, "e": 0, "dense": 1, "p": 8, "n": 8, "s_shared": 8, "t": 5}
    assert not replay(x)  # the claim holds at this model


def test_the_best_link_catches_a_closed_best_one_unit_high(monkeypatch):
    real = L.compute_closed_best
    monkeypatch.setattr(L, "compute_closed_best", lambda *a, **k: real(*a, **k) + 1)
    x = Params(u=1, q=2, d=2, e=0, dense=1, p=9, n=9, s_shared=9)
    assert L.compare_best(x, "vllm-0.33.0") is not None
    monkeypatch.setattr(L, "compute_closed_best", real)
    assert L.compare_best(x, "vllm-0.33.0") is None
