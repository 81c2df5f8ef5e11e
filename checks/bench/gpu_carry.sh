#!/usr/bin/env bash
# make gpu-carry: stage what `make gpu-check` needs on a lent GPU machine that reaches no registry and
# takes at most 64 MiB of carried files: the non-CUDA Mooncake wheel for the image's Python 3.12 (CUDA
# tensors are staged through pinned host buffers; the CUDA wheel is 98 MB and does not fit), and
# libibverbs1 with its two libnl libraries as .debs (extracted there when the image lacks them). The
# image brings torch (CUDA), attrs, hypothesis, pytest, pytest-timeout and numpy. Prints the carry list
# and its size (the dry run); exits 1 when it is over the limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=.cache/gpu-carry
LIMIT=$((64 << 20))
mkdir -p "$CARRY"
ls "$CARRY"/mooncake_transfer_engine_non_cuda-0.3.13.post1-cp312-*.whl >/dev/null 2>&1 || \
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    -d "$CARRY" mooncake-transfer-engine-non-cuda==0.3.13.post1
if ! ls "$CARRY"/libibverbs1_*.deb >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] && apt-get update -qq
  (cd "$CARRY" && apt-get download -qq libibverbs1 libnl-3-200 libnl-route-3-200 2>/dev/null)
fi
tree_bytes=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
carry_bytes=$(find "$CARRY" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
total=$((tree_bytes + carry_bytes))
echo "carry list:"
echo "  working tree (git ls-files): $(git ls-files | wc -l) files, $((tree_bytes / 1024)) KiB"
find "$CARRY" -type f -printf '  %p: %s bytes\n' | sort
echo "total: $total bytes ($((total / 1048576)) MiB) of the $((LIMIT / 1048576)) MiB limit"
[ "$total" -le "$LIMIT" ] || { echo "gpu-carry: over the device's carry limit"; exit 1; }
