#!/usr/bin/env bash
# make gpu-check: on a lent GPU machine (within ~8 minutes): the CUDA Mooncake wheel, the live
# differential tests with CUDA tensors (NCCL when every rank has a GPU, gloo otherwise), and the
# transfer benchmark. Output goes to stdout and, when $OUT is set, to $OUT/gpu-check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$LOG") 2>&1
nvidia-smi -L || { echo "no GPU visible"; exit 2; }
python3 -m venv .venv-gpu
PIP=.venv-gpu/bin/pip
$PIP install -q "torch>=2.4" numpy z3-solver hypothesis pytest attrs
$PIP uninstall -q -y mooncake-transfer-engine-non-cuda 2>/dev/null || true
$PIP install -q mooncake-transfer-engine==0.3.13.post1
$PIP install -q --no-deps -e .
if [ "$(id -u)" = 0 ] && ! ldconfig -p | grep -q libibverbs.so.1; then apt-get update -qq && apt-get install -y -qq libibverbs1; fi
.venv-gpu/bin/python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
export KVSPEC_DEVICE=cuda HYPOTHESIS_PROFILE=ci
timeout 360 .venv-gpu/bin/python -m pytest -q -s tests/test_live.py
timeout 120 .venv-gpu/bin/python -m kvspec.checks bench --json --quick
