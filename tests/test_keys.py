"""Hash chain (I-5) and the store-key grammar: injective, round-tripping, adversarial fields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvspec.spec.errors import SpecError
from kvspec.spec.keys import StoreKey, compute_hash_at, compute_hash_chain, parse_key, render_key

ADVERSARIAL = st.lists(st.sampled_from(list("a@%:0129_ -/") + ["%40", "%25", "@group:", "\x00", "é"]),
                       max_size=8).map("".join)
keys = st.builds(StoreKey, model=ADVERSARIAL, tp_rank=st.integers(0, 99), pcp_rank=st.integers(0, 9),
                 dcp_rank=st.integers(0, 99), pp_rank=st.integers(0, 9), group=st.integers(0, 9),
                 hash_hex=st.text(alphabet="0123456789abcdef", min_size=1, max_size=8), cache_prefix=ADVERSARIAL)


@given(keys)
def test_parse_render_roundtrip(k):
    s = render_key(k)
    assert parse_key(s) == k
    assert render_key(parse_key(s)) == s


@given(keys, keys)
def test_render_injective(k1, k2):
    if k1 != k2:
        assert render_key(k1) != render_key(k2)


def test_vllm_compatible_unprefixed_form():
    k = StoreKey(model="test-model", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex="deadbeef")
    assert render_key(k) == "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@deadbeef"


def test_separator_in_fields_cannot_collide():
    a = StoreKey(model="m@tp_rank:0", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex="ab",
                 cache_prefix="p")
    b = StoreKey(model="tp_rank:0", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex="ab",
                 cache_prefix="p@m")
    assert render_key(a) != render_key(b)


@pytest.mark.parametrize("bad", ["", "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0", "m@tp_rank:01@pcp0@dcp0@pp_rank:0@group:0@ab",
                                 "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@AB", "@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",
                                 "m%41@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab", "m@tp_rank:-1@pcp0@dcp0@pp_rank:0@group:0@ab"])
def test_non_canonical_rejected(bad):
    with pytest.raises(SpecError) as ei:
        parse_key(bad)
    assert ei.value.rule == "key-grammar"


def test_bad_fields_rejected():
    with pytest.raises(SpecError):
        StoreKey(model="m", tp_rank=-1, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex="ab")
    with pytest.raises(SpecError):
        StoreKey(model="m", tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0, hash_hex="xyz")


@given(st.lists(st.integers(0, 50), max_size=40), st.lists(st.integers(0, 50), max_size=40), st.integers(1, 5))
def test_hash_chain_is_prefix_function(a, b, u):
    """I-5: len = ⌊N/u⌋, and H_t agrees between two requests iff their first t tokens agree."""
    ca, cb = compute_hash_chain(a, u), compute_hash_chain(b, u)
    assert len(ca) == len(a) // u
    for k in range(min(len(ca), len(cb))):
        t = (k + 1) * u
        assert (ca[k] == cb[k]) == (a[:t] == b[:t])
        assert compute_hash_at(ca, u, t) == ca[k]


def test_hash_index_domain_and_salt():
    c = compute_hash_chain(list(range(10)), 4)
    for t in (0, 3, 12, -4):
        with pytest.raises(SpecError):
            compute_hash_at(c, 4, t)
    salted = compute_hash_chain(list(range(10)), 4, extra_keys=("salt",))
    assert salted[0] != c[0] and salted[1] != c[1]  # the salt enters unit 1 and chains on
    assert compute_hash_chain(list(range(10)), 4, seed=1)[0] != c[0]
