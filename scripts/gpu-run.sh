#!/usr/bin/env bash
# The GPU run, as one command, on a machine with a CUDA GPU and PyTorch in a Python environment
# (the project's device machine: torch 2.11.0+cu130 in /opt/torch/.venv, meson, ninja, cmake and
# nvcc 13 there, no internet). On a fresh checkout it builds against that torch with CUDA on
# (build-gpu/), runs every test (CUDA cases included), the checkpoint, selective and swap
# benchmarks and the GPT comparison on the GPU (peak device memory included), and writes the raw
# output to $OUT (or ./gpu-out) for docs/benchmarks/. Exits non-zero if anything failed.
#
# Offline, header-only dependencies travel with the checkout: run `bash scripts/gpu-run.sh
# --prepare` here (online, after scripts/setup.sh) to copy doctest into .carry/include
# (git-ignored), and carry .carry to the machine.
#
# Environment: RECOMPOSE_VENV (default /opt/torch/.venv), RECOMPOSE_TORCH_DIR (default the venv's
# site-packages/torch), CUDA_PATH (default /usr/local/cuda), RECOMPOSE_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "gpu-run: $*" >&2; exit 2; }

if [ "${1:-}" = "--prepare" ]; then
  found=""
  for d in /usr/include /usr/local/include; do
    [ -f "$d/doctest/doctest.h" ] && found=$d && break
  done
  [ -n "$found" ] || die "doctest/doctest.h not found here: run scripts/setup.sh first (it installs doctest-dev)"
  mkdir -p .carry/include
  rm -rf .carry/include/doctest
  cp -r "$found/doctest" .carry/include/
  echo "gpu-run: copied $found/doctest into .carry/include; carry .carry to the GPU machine"
  exit 0
fi

# --- tools -------------------------------------------------------------------------------------
venv=${RECOMPOSE_VENV:-/opt/torch/.venv}
# meson and ninja may be installed in the venv only (pip install meson ninja).
[ -d "$venv/bin" ] && export PATH="$PATH:$venv/bin"
for tool in meson ninja c++; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH or in $venv/bin"
done
meson_version=$(meson --version)
[ "$(printf '%s\n1.0.0\n' "$meson_version" | sort -V | head -n1)" = 1.0.0 ] ||
  die "meson $meson_version is too old (need >= 1.0)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
  die "no GPU: nvidia-smi is missing or sees no device"

torch_dir=${RECOMPOSE_TORCH_DIR:-$(ls -d "$venv"/lib/python3*/site-packages/torch 2>/dev/null | head -n1 || true)}
[ -n "$torch_dir" ] && [ -d "$torch_dir/include/torch" ] ||
  die "no torch with C++ headers at '${torch_dir:-$venv/lib/python3*/site-packages/torch}' (set RECOMPOSE_TORCH_DIR)"
[ -e "$torch_dir/lib/libtorch_cuda.so" ] || die "$torch_dir is a CPU-only torch (no lib/libtorch_cuda.so)"

# CUDA Toolkit: meson finds it through CUDA_PATH (or nvcc on PATH); its headers go on every target.
has_toolkit() { [ -n "$1" ] && [ -f "$1/include/cuda_runtime_api.h" ]; }
if ! has_toolkit "${CUDA_PATH:-}"; then
  CUDA_PATH=""
  candidates=("${CUDA_HOME:-}")
  command -v nvcc >/dev/null 2>&1 && candidates+=("$(dirname "$(dirname "$(command -v nvcc)")")")
  candidates+=(/usr/local/cuda /usr/local/cuda-*)
  for d in "${candidates[@]}"; do
    if has_toolkit "$d"; then CUDA_PATH=$d; break; fi
  done
fi
has_toolkit "${CUDA_PATH:-}" || die "no CUDA Toolkit found (set CUDA_PATH to the folder holding bin/nvcc and include/)"
export CUDA_PATH
# meson warns when CUDA_HOME names another folder.
[ -n "${CUDA_HOME:-}" ] && export CUDA_HOME=$CUDA_PATH
export PATH="$PATH:$CUDA_PATH/bin"

# doctest: carried in .carry/include, or installed on this machine.
setup_args=(--buildtype=release -Dtorch_dir="$torch_dir" -Dcuda=enabled --wrap-mode=nodownload)
if [ -f .carry/include/doctest/doctest.h ]; then
  setup_args+=(-Dcpp_args="-I$PWD/.carry/include")
elif ! echo '#include <doctest/doctest.h>' | c++ -x c++ -std=c++20 -fsyntax-only - >/dev/null 2>&1; then
  die "doctest not found (offline): run 'bash scripts/gpu-run.sh --prepare' on an online machine and carry .carry"
fi

out=${OUT:-gpu-out}
mkdir -p "$out"
log="$out/gpu-run-$(date -u +%Y%m%dT%H%M%SZ).txt"
build=build-gpu
jobs=${RECOMPOSE_JOBS:-$(nproc)}

main() {
  local status=0
  echo "date: $(date -u)"
  echo "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
  echo "torch: $torch_dir ($(grep -h '^__version__' "$torch_dir/version.py" | head -n1))"
  echo "CUDA toolkit: $CUDA_PATH ($("$CUDA_PATH/bin/nvcc" --version | tail -n1))"
  echo "meson $meson_version, ninja $(ninja --version), $(c++ --version | head -n1)"
  echo "command: bash scripts/gpu-run.sh"
  # A fresh checkout has no build-gpu: plain setup (meson 1.0 refuses --wipe on a missing
  # folder); later runs reconfigure in place and rebuild only what changed.
  if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" "${setup_args[@]}"
  else
    rm -rf "$build"
    meson setup "$build" "${setup_args[@]}"
  fi
  grep -q 'RECOMPOSE_WITH_CUDA' "$build/build.ninja" || { echo "CUDA IS NOT ON in $build"; return 1; }
  ninja -C "$build" -j "$jobs" || { echo "BUILD FAILED"; return 1; }
  meson test -C "$build" --print-errorlogs --num-processes 1 || { echo "TESTS FAILED"; status=1; }
  # Here the CUDA cases (tests/cuda_test.cpp) must run: any skipped case means they did not.
  local totals
  totals=$(bash scripts/doctest-totals.sh "$build/meson-logs/testlog.txt")
  echo "$totals"
  case "$totals" in *" 0 skipped") ;; *) echo "CUDA TEST CASES SKIPPED (no CUDA device seen by the tests?)"; status=1 ;; esac
  for b in checkpoint_bench/checkpoint_bench selective_bench/selective_bench swap_bench/swap_bench; do
    echo "== $b --device cuda"
    "$build/examples/$b" --device cuda || { echo "BENCHMARK FAILED: $b"; status=1; }
  done
  echo "== gpt --compare --steps 20 --device cuda"
  "$build/examples/gpt/gpt" --compare --steps 20 --device cuda --sample 0 --out "$out/gpt_out" ||
    { echo "GPT COMPARE FAILED"; status=1; }
  if [ $status -eq 0 ]; then echo "gpu-run: all passed"; else echo "gpu-run: FAILURES above"; fi
  return $status
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
