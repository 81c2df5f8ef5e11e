# kvspec: `make verify` (the proofs) and `make test` work on a fresh machine by themselves.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.kvspec-installed
PROFILE ?= ci
# CPU machines take the CPU wheel of torch from local disk; a plain `torch` would pull a CUDA build.
TORCH   ?= torch==2.13.0
MOONCAKE_EXTRA ?= mooncake-cpu

.PHONY: all venv verify test test-fast bench gpu-check clean

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

verify: $(STAMP)
	$(BIN)/python -m kvspec.checks verify

test: $(STAMP)
	HYPOTHESIS_PROFILE=$(PROFILE) $(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -q -x -m "not live and not slow" tests

bench: $(STAMP)
	$(BIN)/python -m kvspec.checks bench --json

# On a lent GPU machine: CUDA Mooncake wheel, CUDA tensors + NCCL live test, transfer bench.
gpu-check:
	bash checks/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
