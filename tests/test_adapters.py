"""Engine adapters and `kvspec conform --adapter`: kvspec's implementation conforms to the rule set it claims;
the legacy loader fails, and its shrunk counterexample is a runnable explain command showing the -704."""

from __future__ import annotations

import shlex

import pytest

from kvspec.checks.adapters import (
    IMPL,
    IMPL_LOOKAHEAD,
    IMPL_PR53324,
    LEGACY,
    EngineAdapter,
    load_adapter,
    run_adapter_conformance,
)
from kvspec.checks.cli import main
from kvspec.spec.errors import SpecError

from .conftest import require


@pytest.mark.parametrize("adapter,rules", [(IMPL, "vllm-0.33.0"), (IMPL_PR53324, "pr53324"),
                                           (IMPL_LOOKAHEAD, "vllm-0.33.0-lookahead")])
def test_the_implementation_conforms(adapter, rules):
    require("torch")
    rep = run_adapter_conformance(adapter, rules, examples=150)
    assert rep["ok"], rep
    assert rep["vectors"] > 150 and rep["searched"] == 150


def test_the_legacy_loader_is_caught_with_a_runnable_counterexample(capsys):
    require("torch")
    rep = run_adapter_conformance(LEGACY, "pr53324", examples=150)
    assert not rep["ok"] and rep["vector_disagreements"] and rep["search_disagreement"]
    assert "tails" in rep["search_disagreement"]["fields"]
    cmd = shlex.split(rep["search_disagreement"]["command"])
    assert cmd[:2] == ["kvspec", "explain"]
    legacy = [*cmd[1:-2], "--rules", "legacy", "--check"]  # the same scenario under the legacy rule set
    assert main(legacy) == 1  # a planned load key that was never stored: Mooncake's -704
    assert main([*cmd[1:], "--check"]) == 0  # the PR's rules load only stored keys
    capsys.readouterr()


def test_cli_exit_codes_and_bad_adapters(capsys):
    require("torch")
    assert main(["conform", "--adapter", "kvspec.checks.adapters:IMPL", "--examples", "20"]) == 0
    assert main(["conform", "--adapter", "kvspec.checks.adapters:LEGACY", "--rules", "pr53324",
                 "--examples", "20"]) == 1
    assert "DISAGREEMENT" in capsys.readouterr().out
    for bad in ("nope", "kvspec.checks.adapters:NOPE", "json:dumps"):
        with pytest.raises(SpecError):
            load_adapter(bad)
    assert isinstance(IMPL, EngineAdapter)
