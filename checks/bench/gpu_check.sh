#!/usr/bin/env bash
# make gpu-check, on a lent GPU machine (one run, within 8 minutes; the device tool's command is
# `bash checks/bench/gpu_check.sh` with carry [".cache/gpu-carry"], staged here first by `make gpu-carry`).
# Uses the image's Python 3.12 and CUDA torch; installs only the carried non-CUDA Mooncake wheel (no
# registry there). Runs the live differential tests on CUDA tensors (NCCL when there is a GPU per rank,
# otherwise gloo with D processes sharing one GPU; KV staged through pinned host buffers) and the
# tiny real model's end-to-end test (tests/test_model.py: real DCP attention over NCCL or gloo), the
# transfer bench, and prints the same totals as the CPU run. Output also goes to $OUT/gpu-check.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
OUTDIR=${OUT:-/tmp}
exec > >(tee "$OUTDIR/gpu-check.log") 2>&1
step() { echo "== $* ($(( $(date +%s) - START )) s)"; }
step "GPUs"
nvidia-smi -L || { echo "gpu-check: no GPU visible"; exit 2; }
CARRY=.cache/gpu-carry
[ -d "$CARRY" ] || { echo "gpu-check: $CARRY missing: run make gpu-carry here and carry it"; exit 2; }
if ! ldconfig -p | grep -q libibverbs.so.1; then
  step "libibverbs1 from the carried .debs"
  mkdir -p .cache/ibverbs
  for d in "$CARRY"/*.deb; do dpkg-deb -x "$d" .cache/ibverbs; done
  export LD_LIBRARY_PATH="$PWD/.cache/ibverbs/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
step "venv over the image's packages + the carried Mooncake wheel"
python3 -m venv --system-site-packages .venv-gpu
.venv-gpu/bin/pip install -q --no-index --no-deps "$CARRY"/mooncake_transfer_engine_non_cuda-*.whl
# kvspec without a build step: its three packages through a symlink tree on PYTHONPATH
mkdir -p .cache/gpu-src/kvspec && for d in spec checks impl; do ln -sfn "$PWD/$d" ".cache/gpu-src/kvspec/$d"; done
export PYTHONPATH="$PWD/.cache/gpu-src" KVSPEC_DEVICE=cuda HYPOTHESIS_PROFILE=ci
PY=.venv-gpu/bin/python
$PY -c "import torch, mooncake.store; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
'devices', torch.cuda.device_count())"
step "live differential tests on CUDA tensors"
timeout 330 $PY -m pytest -q -s -p no:cacheprovider --timeout=300 -m "live and not slow" \
  tests/test_live.py tests/test_faults.py --junitxml="$OUTDIR/gpu-live.xml" || status=$?
step "the tiny real model end to end on CUDA (warm == cold bitwise, mutants, the draft-KV hazard)"
timeout 240 $PY -m pytest -q -s -p no:cacheprovider --timeout=230 tests/test_model.py \
  --junitxml="$OUTDIR/gpu-model.xml" || status=$?
step "transfer bench"
timeout 120 $PY -m kvspec.checks bench --json --quick --transfer-only > "$OUTDIR/gpu-bench.json" || status=$?
cat "$OUTDIR/gpu-bench.json"
step "done"
exit "${status:-0}"
