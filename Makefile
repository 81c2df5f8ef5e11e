# kvspec: `make verify` (the proofs) and `make test` work on a fresh machine by themselves.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.kvspec-installed
PROFILE ?= ci
# CPU machines take the CPU wheel of torch from local disk; a plain `torch` would pull a CUDA build.
TORCH   ?= torch==2.13.0
MOONCAKE_EXTRA ?= mooncake-cpu

# The vLLM 0.33.0 oracle lives in its own venv: vllm from its wheel without its dependency tree.
VVENV   := .venv-vllm
VSTAMP  := $(VVENV)/.kvspec-installed
VLLM_WHEELS ?= .cache/vllm-wheel

.PHONY: all venv vllm-venv verify test test-main test-vllm test-fast conform bench gpu-check clean

all: verify test

$(STAMP): pyproject.toml
	@if [ "$$(id -u)" = "0" ] && ! ldconfig -p | grep -q libibverbs.so.1; then \
	  echo "installing libibverbs1 (needed by the Mooncake wheel)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null; fi
	@[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[verify,test,impl,$(MOONCAKE_EXTRA)]"
	@touch $(STAMP)

venv: $(STAMP)

$(VSTAMP): pyproject.toml requirements/vllm-oracle.txt
	@[ -x $(VVENV)/bin/python ] || $(PY) -m venv $(VVENV)
	@$(VVENV)/bin/python -c "import torch" 2>/dev/null || $(VVENV)/bin/pip install -q "$(TORCH)"
	$(VVENV)/bin/pip install -q -r requirements/vllm-oracle.txt
	@ls $(VLLM_WHEELS)/vllm-0.33.0-*.whl >/dev/null 2>&1 || \
	  $(VVENV)/bin/pip download -q --no-deps -d $(VLLM_WHEELS) vllm==0.33.0
	$(VVENV)/bin/pip install -q --no-deps $(VLLM_WHEELS)/vllm-0.33.0-*.whl
	$(VVENV)/bin/pip install -q --no-deps -e .
	@touch $(VSTAMP)

vllm-venv: $(VSTAMP)

verify: $(STAMP)
	$(BIN)/python -m kvspec.checks verify

test: test-main test-vllm

test-main: $(STAMP)
	HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest -q -m "not vllm" tests

# vLLM 0.33.0's own code as the oracle of the vllm-0.33.0 rule set (tests/test_vllm_conformance.py)
test-vllm: $(VSTAMP)
	HYPOTHESIS_PROFILE=$(PROFILE) $(VVENV)/bin/python -m pytest -q -m vllm tests/test_vllm_conformance.py

conform: $(VSTAMP)
	$(VVENV)/bin/kvspec conform vllm

test-fast: $(STAMP)
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -q -x -m "not live and not slow and not vllm" tests

bench: $(STAMP)
	$(BIN)/python -m kvspec.checks bench --json

# On a lent GPU machine: CUDA Mooncake wheel, CUDA tensors + NCCL live test, transfer bench.
gpu-check:
	bash checks/gpu_check.sh

clean:
	rm -rf $(VENV) $(VVENV) .cache .pytest_cache .hypothesis build *.egg-info
