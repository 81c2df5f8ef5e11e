"""What runs for each rule set, in one table: adding a rule set to checks/ is adding a row here.

The rule sets themselves (what they do) are values in spec/rules.py; this table says how checks/ exercises
each: its test vectors, whether it has a closed form and a Z3 chain (checks/closed_form.py, prove.py), a row
in make verify's exhaustive pass, the bench and efficiency tables, and the engine release whose own code is
its oracle (`kvspec conform vllm` compares an installed vLLM with the row whose `oracle` names its version).
"""

from __future__ import annotations

import attrs

from kvspec.spec.rules import RULE_SETS

VECTORS_FULL = "full"  # every suite: worked, boundaries, exhaustive sample, mutants, coverage, failure, keys
VECTORS_COUNTEREXAMPLES = "counterexamples"  # an unsafe rule set: its counterexamples only


EXHAUSTIVE_VERIFY = "verify"  # the rule set's EXHAUSTIVE row runs in make verify
EXHAUSTIVE_FULL = "full"  # in make verify-full only (its Z3 chain is in make verify)


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

    @property
    def at(self) -> str:
        """Return the suffix of the rule set's check ids: check_suffix when given, else "@" + the name."""
        return f"@{self.rules}" if self.check_suffix is None else self.check_suffix


RULE_CHECKS: tuple[RuleChecks, ...] = (
    RuleChecks(rules="legacy", vectors=VECTORS_COUNTEREXAMPLES, key_vectors=False, exhaustive="", bench=False),
    RuleChecks(rules="pr53324", vectors=VECTORS_FULL, key_vectors=False, exhaustive=EXHAUSTIVE_VERIFY, bench=True, check_suffix=""),
    RuleChecks(rules="vllm-0.33.0", vectors=VECTORS_FULL, key_vectors=True, exhaustive=EXHAUSTIVE_VERIFY, bench=True,
               oracle="vllm==0.33.0"),
    RuleChecks(rules="vllm-0.33.0-lookahead", vectors=VECTORS_FULL, key_vectors=True, exhaustive=EXHAUSTIVE_FULL, bench=True),
    RuleChecks(rules="vllm-0.34.0", vectors=VECTORS_FULL, key_vectors=True, exhaustive=EXHAUSTIVE_VERIFY, bench=True,
               oracle="vllm==0.34.0"),
    # SGLang (issue 32): stated from SGLang 0.5.23's sources; its own code is the oracle (kvspec conform sglang,
    # checks/sglang_oracle.py: the wheel, not an installed release) and answers the vectors as an adapter
    RuleChecks(rules="sglang-0.5.23", vectors=VECTORS_FULL, key_vectors=False, exhaustive=EXHAUSTIVE_VERIFY, bench=False),
    RuleChecks(rules="sglang-0.5.23-bigram", vectors="", key_vectors=False, exhaustive="", bench=False),
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
