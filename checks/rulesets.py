"""What runs for each rule set, in one table: adding a rule set to checks/ is adding a row here.

The rule sets themselves (what they do) are values in spec/rules.py; this table says how checks/ exercises
each: its test vectors, whether it has a closed form and a Z3 chain (checks/verify/closed_form.py, prove.py), a row
in make verify's exhaustive pass, the bench and efficiency tables, and the engine release whose own code is
its oracle (`kvspec conform vllm` compares an installed vLLM with the row whose `oracle` names its version),
and what each cache-efficiency property gives under it (holds, or refuted with its measured count).
"""

from __future__ import annotations

import attrs

from kvspec.spec.rules import (
    LEGACY,
    PR53324,
    RULE_SETS,
    SGLANG_0_5_23,
    SGLANG_0_5_23_BIGRAM,
    VLLM_0_33,
    VLLM_0_33_LOOKAHEAD,
    VLLM_0_34,
)

VECTORS_FULL = "full"  # every suite: worked, boundaries, exhaustive sample, mutants, coverage, failure, keys
VECTORS_COUNTEREXAMPLES = "counterexamples"  # an unsafe rule set: its counterexamples only


EXHAUSTIVE_VERIFY = "verify"  # the rule set's EXHAUSTIVE row runs in make verify
EXHAUSTIVE_FULL = "full"  # in make verify-full only (its Z3 chain is in make verify)


PROPERTY_HOLDS = "holds"
PROPERTY_REFUTED = "refuted"


@attrs.frozen
class Expect:
    """What one cache-efficiency property row (checks/verify/efficiency.py PROPERTIES) gives under the rule set: holds or
    refuted, measured on one geometry in `sample` of its scope, and a refuted row's refutations at that sample (a
    change in either direction fails the row and is worth a look; make verify-full samples nothing and judges only
    holds / refuted)."""

    prop: str
    expected: str
    sample: int
    count: int | None = None


def _holds(prop: str, sample: int) -> Expect:
    return Expect(prop, PROPERTY_HOLDS, sample)


def _refuted(prop: str, sample: int, count: int) -> Expect:
    return Expect(prop, PROPERTY_REFUTED, sample, count)


@attrs.frozen(kw_only=True)
class RuleChecks:
    """How checks/ exercises one rule set (spec/rules.py has what it does)."""

    rules: str
    vectors: str
    key_vectors: bool  # keys/render vectors (the hash chain and key strings at the rule set's λ)
    exhaustive: str  # its row of the EXHAUSTIVE pass (the registry over the small scope): in make verify, in
    #                  make verify-full only, or none
    bench: bool  # the lookup bench, efficiency and conversation tables, the plot
    oracle: str | None = None  # "vllm==VERSION": that release's own code answers for this rule set
    check_suffix: str | None = None  # what its check ids end with (make verify: "ID@rules"; "" for the PR's chain)
    properties: tuple[Expect, ...] = ()  # its rows of make verify's cache-efficiency pass, with what each gives

    @property
    def at(self) -> str:
        """Return the suffix of the rule set's check ids: check_suffix when given, else "@" + the name."""
        return f"@{self.rules}" if self.check_suffix is None else self.check_suffix


RULE_CHECKS: tuple[RuleChecks, ...] = (
    RuleChecks(rules=LEGACY, vectors=VECTORS_COUNTEREXAMPLES, key_vectors=False, exhaustive="", bench=False,
               properties=(_holds("COMPACT", 13),)),
    RuleChecks(rules=PR53324, vectors=VECTORS_FULL, key_vectors=False, exhaustive=EXHAUSTIVE_VERIFY, bench=True,
               check_suffix="",
               properties=(_refuted("BEST", 11, 1058), _refuted("RESEND", 4, 29456), _holds("MONO-PREFIX", 7),
                           _refuted("MONO-EVICT", 7, 1314), _refuted("MONO-MORE", 13, 750),
                           _refuted("CONTENT", 7, 809), _holds("COMPACT", 13))),
    RuleChecks(rules=VLLM_0_33, vectors=VECTORS_FULL, key_vectors=True, exhaustive=EXHAUSTIVE_VERIFY, bench=True,
               oracle="vllm==0.33.0",
               properties=(_refuted("BEST", 11, 280), _holds("RESEND", 3), _holds("MONO-PREFIX", 7),
                           _refuted("MONO-EVICT", 7, 1481), _holds("MONO-MORE", 13), _refuted("CONTENT", 7, 152),
                           _holds("FINISHED", 13), _holds("COMPACT", 13))),
    RuleChecks(rules=VLLM_0_33_LOOKAHEAD, vectors=VECTORS_FULL, key_vectors=True, exhaustive=EXHAUSTIVE_FULL,
               bench=True,
               properties=(_holds("BEST", 11), _holds("RESEND", 3), _holds("MONO-EVICT", 7), _holds("CONTENT", 7))),
    # FINISHED (issue 28): writers that decoded (deferred saves) or saved their decode phase, read by a continuing lookup
    RuleChecks(rules=VLLM_0_34, vectors=VECTORS_FULL, key_vectors=True, exhaustive=EXHAUSTIVE_VERIFY, bench=True,
               oracle="vllm==0.34.0",
               properties=(_holds("SPLIT", 3), _holds("CONTENT", 7), _holds("FINISHED", 13), _holds("COMPACT", 13))),
    # SGLang (issue 32): stated from SGLang 0.5.23's sources; its own code is the oracle (kvspec conform sglang,
    # checks/conform/sglang_oracle.py: the wheel, not an installed release) and answers the vectors as an adapter. CONTENT: the
    # draft-KV hazard of Mamba hybrids with EAGLE (plain page keys), closed by bigram keys, on every geometry of the
    # scope SGLang runs (its configuration refuses the rest)
    RuleChecks(rules=SGLANG_0_5_23, vectors=VECTORS_FULL, key_vectors=False, exhaustive=EXHAUSTIVE_VERIFY, bench=False,
               properties=(_refuted("CONTENT", 1, 571), _holds("COMPACT", 1))),
    RuleChecks(rules=SGLANG_0_5_23_BIGRAM, vectors="", key_vectors=False, exhaustive="", bench=False,
               properties=(_holds("CONTENT", 1),)),
)
assert [r.rules for r in RULE_CHECKS] == list(RULE_SETS), "a row per rule set of spec/rules.py, in its order"


def get_rule_checks(rules: str) -> RuleChecks:
    """Return the row of a rule set."""
    return next(r for r in RULE_CHECKS if r.rules == rules)


def find_oracle_rules(engine: str, version: str) -> str | None:
    """Return the rule set whose oracle is that engine release (None: no rule set describes it)."""
    return next((r.rules for r in RULE_CHECKS if r.oracle == f"{engine}=={version}"), None)


def list_rules(field: str) -> tuple[str, ...]:
    """Return the rule sets whose row has `field` true (vectors: the full suites), in table order."""
    if field == "vectors":
        return tuple(r.rules for r in RULE_CHECKS if r.vectors == VECTORS_FULL)
    return tuple(r.rules for r in RULE_CHECKS if getattr(r, field))
