#!/usr/bin/env bash
# The GPU run, as one command, on a machine with a CUDA GPU and PyTorch in a Python environment
# (the project's device machine has torch 2.11.0+cu130 in /opt/torch/.venv and no internet).
# Builds against that torch with CUDA on, runs every test (CUDA cases included) and the swap and
# checkpoint benchmarks, and writes the raw output to $OUT (or ./gpu-out) for docs/benchmarks/.
#
# Header-only dependencies travel with the checkout: `bash scripts/gpu-run.sh --prepare` here
# copies doctest and range-v3 into .carry/include (git-ignored); carry .carry to the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .carry/include
  cp -r /usr/include/doctest /usr/include/range .carry/include/
  cp -r /usr/include/meta .carry/include/ 2>/dev/null || true
  cp -r /usr/include/concepts .carry/include/ 2>/dev/null || true
  exit 0
fi
torch_dir=${RECOMPOSE_TORCH_DIR:-$(ls -d /opt/torch/.venv/lib/python3*/site-packages/torch | head -n1)}
out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/gpu-run-$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "date: $(date -u)"
  echo "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
  echo "torch: $torch_dir ($(grep -h '__version__' "$torch_dir/version.py" | head -n1))"
  echo "command: bash scripts/gpu-run.sh"
  meson setup build-gpu --buildtype=release -Dtorch_dir="$torch_dir" -Dcuda=enabled \
    -Dcpp_args="-I$PWD/.carry/include" --wipe
  ninja -C build-gpu -j "$(nproc)"
  meson test -C build-gpu --print-errorlogs --num-processes 1 || echo "TESTS FAILED"
  for b in swap_bench/swap_bench checkpoint_bench/checkpoint_bench selective_bench/selective_bench; do
    if [ -x "build-gpu/examples/$b" ]; then echo "== $b"; "build-gpu/examples/$b" --device cuda || "build-gpu/examples/$b"; fi
  done
} 2>&1 | tee "$log"
