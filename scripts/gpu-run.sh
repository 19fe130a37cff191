#!/usr/bin/env bash
# The GPU run, as one command, on a machine with a CUDA GPU and PyTorch in a Python environment
# (the project's device machine: torch 2.11.0+cu130 in /opt/torch/.venv, meson, ninja, cmake and
# nvcc 13 there, no internet). On a fresh checkout it builds against that torch with CUDA on
# (build-gpu/), runs every test (CUDA cases included), the checkpoint, selective and swap
# benchmarks and the GPT comparison on the GPU (peak device memory included), and writes the raw
# output to $OUT (or ./gpu-out) for docs/benchmarks/. Exits non-zero if anything failed.
#
#   bash scripts/gpu-run.sh [all|build|test|bench|gpt]
#
# Phases (each builds first; a later call reuses build-gpu/): test (meson test, the CUDA doctest
# cases must not be skipped), bench (checkpoint, selective and swap benchmarks, copy bandwidth),
# gpt (the GPT comparison, small fp32 and 12 x 1024 bf16, and examples/gpt/python/gpu_compare.sh:
# C++ against PyTorch Python on the same GPU). The log goes to $OUT/gpu-run-<phase>-<time>.txt.
#
# Offline, header-only dependencies travel with the checkout: run `bash scripts/gpu-run.sh
# --prepare` here (online, after scripts/setup.sh) to copy doctest and nlohmann into .carry/include
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
  rm -rf .carry/include/doctest .carry/include/nlohmann
  cp -r "$found/doctest" .carry/include/
  # nlohmann/json (the planner's JSON files), header-only too.
  for d in /usr/include /usr/local/include; do
    [ -f "$d/nlohmann/json.hpp" ] && cp -r "$d/nlohmann" .carry/include/ && break
  done
  [ -f .carry/include/nlohmann/json.hpp ] || die "nlohmann/json.hpp not found here: run scripts/setup.sh first (it installs nlohmann-json3-dev)"
  echo "gpu-run: copied doctest and nlohmann into .carry/include; carry .carry to the GPU machine"
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
phase=${1:-all}
case "$phase" in all|build|test|bench|gpt) ;; *) die "unknown phase '$phase' (all, build, test, bench or gpt)" ;; esac
log="$out/gpu-run-$phase-$(date -u +%Y%m%dT%H%M%SZ).txt"
build=build-gpu
jobs=${RECOMPOSE_JOBS:-$(nproc)}
# The realistic GPT of the benchmarks: 12 blocks of width 1024, 16 heads, context 1024, batch 8,
# bf16 autocast (about 150M parameters; ~25 ms per step on an H100 without checkpointing).
gpt_model=(--layers 12 --width 1024 --heads 16 --context 1024 --batch 8)

stamp() { echo "-- $(date -u +%H:%M:%S) ($SECONDS s) $*"; }
# Runs a command, prints its output without the lines matching the pattern, returns its status.
quietly() {  # pattern command...
  local pattern="$1" file rc=0
  shift
  file=$(mktemp)
  "$@" >"$file" 2>&1 || rc=$?
  grep -v -E "$pattern" "$file" || true
  rm -f "$file"
  return $rc
}

do_build() {
  stamp "build"
  # A fresh checkout has no build-gpu: plain setup (meson 1.0 refuses --wipe on a missing
  # folder); later runs reconfigure in place and rebuild only what changed.
  if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" "${setup_args[@]}" >/dev/null
  else
    rm -rf "$build"
    meson setup "$build" "${setup_args[@]}"
  fi
  grep -q 'RECOMPOSE_WITH_CUDA' "$build/build.ninja" || { echo "CUDA IS NOT ON in $build"; return 1; }
  quietly '^\[[0-9]+/[0-9]+\] (Compiling|Linking|Precompiling)' ninja -C "$build" -j "$jobs" ||
    { echo "BUILD FAILED"; return 1; }
  stamp "build done"
}

do_test() {
  local status=0
  stamp "tests"
  meson test -C "$build" --print-errorlogs --num-processes 1 || { echo "TESTS FAILED"; status=1; }
  # Here the CUDA cases (tests/cuda_test.cpp) must run: any skipped case means they did not.
  local totals
  totals=$(bash scripts/doctest-totals.sh "$build/meson-logs/testlog.txt")
  echo "$totals"
  case "$totals" in *" 0 skipped") ;; *) echo "CUDA TEST CASES SKIPPED (no CUDA device seen by the tests?)"; status=1 ;; esac
  echo "CUDA cases:"
  "$build/tests/test_checkpoint" --test-case='cuda*' --success=false 2>&1 | tail -n 4
  stamp "tests done"
  return $status
}

# One step of a phase: a timestamped heading, the command, a FAILED line if it fails.
run_step() {  # heading command...
  local heading="$1"
  shift
  stamp "$heading"
  "$@" || { echo "FAILED: $heading"; return 1; }
}

do_bench() {
  local status=0 b
  # RECOMPOSE_BENCHES: which of them (default all three; selective_bench takes ~100 s).
  local benches=" ${RECOMPOSE_BENCHES:-checkpoint selective swap} "
  for b in $benches; do
    run_step "${b}_bench --device cuda" "$build/examples/${b}_bench/${b}_bench" --device cuda || status=1
  done
  # Width 2048: twice the arithmetic per activation byte, where swapping can hide behind compute.
  case "$benches" in
    *" swap "*)
      run_step "swap_bench --device cuda --dim 2048 --layers 4 --seq 2048 --batch 4" \
        "$build/examples/swap_bench/swap_bench" --device cuda --dim 2048 --layers 4 --seq 2048 --batch 4 || status=1 ;;
  esac
  stamp "benchmarks done"
  return $status
}

# The summary lines of one GPT run under --phase-times.
gpt_phases() {  # policy
  "$build/examples/gpt/gpt" --policy "$1" --phase-times --steps 6 --device cuda --bf16 --sample 0 \
    --out "$out/gpt_phases" "${gpt_model[@]}" 2>&1 | grep -E '^(policy|  step time|  phases|  +the device|  step peak|  swapped)'
}

do_gpt() {
  local status=0 policy
  run_step "gpt --compare --steps 20 --device cuda (the small default model)" \
    "$build/examples/gpt/gpt" --compare --steps 20 --device cuda --sample 0 --out "$out/gpt_small" || status=1
  run_step "gpt --compare --steps 10 --device cuda --bf16 ${gpt_model[*]}" \
    quietly '^[a-z-]+ +[0-9]+/[0-9]+ ' "$build/examples/gpt/gpt" --compare --steps 10 --device cuda --bf16 --sample 0 \
    --out "$out/gpt_large" "${gpt_model[@]}" || status=1
  # Where the time goes, per policy: forward, backward (with its recomputation and reloads) and
  # the optimizer, the device synchronised between them.
  for policy in none full selective every-second-mm swap offload; do
    run_step "gpt --policy $policy --phase-times --steps 6 --device cuda --bf16 ${gpt_model[*]}" gpt_phases "$policy" ||
      status=1
  done
  run_step "gpu_compare.sh (C++ against PyTorch Python, alternating)" \
    env RECOMPOSE_GPT="$build/examples/gpt/gpt" RECOMPOSE_PYTHON="$venv/bin/python" \
    bash examples/gpt/python/gpu_compare.sh --rounds 2 --steps 10 --model "${gpt_model[*]}" || status=1
  stamp "gpt done"
  return $status
}

main() {
  local status=0
  echo "date: $(date -u)"
  echo "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
  echo "torch: $torch_dir ($(grep -h '^__version__' "$torch_dir/version.py" | head -n1))"
  echo "CUDA toolkit: $CUDA_PATH ($("$CUDA_PATH/bin/nvcc" --version | tail -n1))"
  echo "meson $meson_version, ninja $(ninja --version), $(c++ --version | head -n1), $(nproc) cores"
  echo "command: bash scripts/gpu-run.sh $phase ($(git rev-parse --short HEAD 2>/dev/null || echo no git)$(git diff --quiet 2>/dev/null || echo ', with local changes'))"
  do_build || return 1
  case "$phase" in
    all) do_test || status=1; do_bench || status=1; do_gpt || status=1 ;;
    test) do_test || status=1 ;;
    bench) do_bench || status=1 ;;
    gpt) do_gpt || status=1 ;;
  esac
  if [ $status -eq 0 ]; then echo "gpu-run: all passed"; else echo "gpu-run: FAILURES above"; fi
  return $status
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
