#!/usr/bin/env bash
# make gpu-check: on a lent GPU machine (within ~8 minutes): the CUDA Mooncake wheel, the live
# differential tests with CUDA tensors (NCCL when every rank has a GPU, gloo otherwise), and the
# transfer benchmark. Output goes to stdout and, when $OUT is set, to $OUT/gpu-check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$LOG") 2>&1
nvidia-smi -L || { echo "no GPU visible"; exit 2; }
# The device machine reaches no registry: wheels travel in .whl/ (see the device tool's README),
# downloaded here with `pip download --only-binary=:all: --python-version 3.12 ... -d .whl` for
# torch (CUDA), numpy, attrs, hypothesis, pytest, sortedcontainers, mooncake-transfer-engine.
python3 -m venv --system-site-packages .venv-gpu
PIP=.venv-gpu/bin/pip
FIND=""; [ -d .whl ] && FIND="--no-index --find-links .whl"
$PIP install -q $FIND torch numpy attrs hypothesis pytest
$PIP uninstall -q -y mooncake-transfer-engine-non-cuda 2>/dev/null || true
$PIP install -q $FIND mooncake-transfer-engine==0.3.13.post1
$PIP install -q --no-deps --no-build-isolation -e .
if [ "$(id -u)" = 0 ] && ! ldconfig -p | grep -q libibverbs.so.1; then apt-get update -qq && apt-get install -y -qq libibverbs1; fi
.venv-gpu/bin/python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
export KVSPEC_DEVICE=cuda HYPOTHESIS_PROFILE=ci
timeout 360 .venv-gpu/bin/python -m pytest -q -s tests/test_live.py
timeout 120 .venv-gpu/bin/python -m kvspec.checks bench --json --quick
