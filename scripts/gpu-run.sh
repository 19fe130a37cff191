#!/usr/bin/env bash
# The GPU run, as one command, on a machine with a CUDA GPU and PyTorch in a Python environment
# (the project's device machine: torch 2.11.0+cu130 in /opt/torch/.venv, meson, ninja, cmake and
# nvcc 13 there, no internet). On a fresh checkout it builds against that torch with CUDA on
# (build-gpu/), runs every test (CUDA cases included), the checkpoint, selective and swap
# benchmarks and the GPT comparison on the GPU (peak device memory included), and writes the raw
# output to $OUT (or ./gpu-out) for docs/benchmarks/. Exits non-zero if anything failed.
#
#   bash scripts/gpu-run.sh [all|build|test|bench|gpt|offload|compile|sharded|verdict]
#   RECOMPOSE_REHEARSAL=1 bash scripts/gpu-run.sh verdict   # the same steps here, on the CPU
#
# verdict (issue 35): does the selective replay beat the straight line between none and full on
# the device? One call of at most 9 minutes on a fresh machine: it builds only test_checkpoint,
# gpt and selective_bench, then, each step bounded by `timeout` and its output in the log as soon
# as it ends: (1) the CUDA suites of test_checkpoint (cuda, cuda_link, cuda differential; run
# with --no-skip, so a test binary that sees no device fails instead of skipping); (2) gpt
# --compare, 10 steps, every policy interleaved step by step; (3) gpt --sweep, the planner's
# estimate beside each measured step; (4) selective_bench's host time per intercepted op in a
# 200-op region; (5) a Kineto profile of 3 selective steps, then of 3 steps of none and full
# beside it; (6) selective_bench's region cost (the replay against its ops). The 12 x 1024 bf16
# GPT throughout.
# Device time, estimated from the H100 logs of 2026-11-23 (whole-tree build 87-103 s on 16
# cores, the CUDA suites ~25 s with 300 differential cases, compare ~45 s and sweep ~50 s of
# 12 x 1024 bf16 steps at 35-120 ms, profiles ~20 s each): build ~95 s, steps ~4 min, about
# 6 minutes in all, plus the machine's start (1-2 minutes). The steps' bounds add up to 8.5
# minutes after the build's 4.
# RECOMPOSE_REHEARSAL=1 runs the verdict's steps on this machine's CPU (./build, or
# RECOMPOSE_BUILD_DIR; a 2 x 64 model, float32): every command line, path and filter the device
# call will use, checked before device time is spent on it.
#
# Phases (each builds first; a later call reuses build-gpu/): test (meson test, the CUDA doctest
# cases must not be skipped), bench (checkpoint, selective and swap benchmarks, copy bandwidth),
# gpt (the GPT comparison, small fp32 and 12 x 1024 bf16, the Kineto profile of none, full and
# selective on the 12 x 1024 bf16 model (gpt --profile, issue 25), and
# examples/gpt/python/gpu_compare.sh: C++ against PyTorch Python on the same GPU), offload (issue 27: the link probe, the never-stall
# offload, the planner's sweep with its estimate beside each measured step, a peak-budget sweep,
# the 24 x 2048 model and a memory cap under which no checkpointing does not fit), compile (issue
# 27: the Python peer of the 12 x 1024 bf16 GPT under torch.compile at several
# activation_memory_budget values, time and peak against its own compiled step at 1.0, to set
# beside the planner's sweep of the offload phase), sharded (issue 27: examples/sharded on CUDA,
# NCCL at world 1 and Gloo at world 2, with checkpointing and offload on the all-gathered blocks:
# --check against unsharded training, collective counts and times, offload copies against the
# collectives; examples/sharded/gpu_check.sh). The log goes to $OUT/gpu-run-<phase>-<time>.txt.
# Environment for compile: RECOMPOSE_COMPILE_BUDGETS (default 1.0,0.75,0.5,0.3,0.0).
#
# Offline, header-only dependencies travel with the checkout: run `bash scripts/gpu-run.sh
# --prepare` here (online, after scripts/setup.sh) to copy doctest, range-v3 and nlohmann into .carry/include
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
  # range-v3 (header-only, used inside lib/): its four include folders.
  ranges=""
  for d in /usr/include /usr/local/include; do
    [ -f "$d/range/v3/view/enumerate.hpp" ] && ranges=$d && break
  done
  [ -n "$ranges" ] || die "range-v3 not found here: run scripts/setup.sh first (it installs librange-v3-dev)"
  for sub in range meta concepts std; do
    rm -rf ".carry/include/$sub"
    cp -r "$ranges/$sub" .carry/include/
  done
  # nlohmann/json (the planner's JSON files), header-only too.
  for d in /usr/include /usr/local/include; do
    [ -f "$d/nlohmann/json.hpp" ] && cp -r "$d/nlohmann" .carry/include/ && break
  done
  [ -f .carry/include/nlohmann/json.hpp ] || die "nlohmann/json.hpp not found here: run scripts/setup.sh first (it installs nlohmann-json3-dev)"
  echo "gpu-run: copied doctest ($found), range-v3 ($ranges) and nlohmann into .carry/include; carry .carry to the GPU machine"
  exit 0
fi

# --- tools -------------------------------------------------------------------------------------
rehearsal=${RECOMPOSE_REHEARSAL:-0}
if [ "$rehearsal" = 1 ] && [ "${1:-}" != verdict ]; then
  die "RECOMPOSE_REHEARSAL=1 rehearses the verdict phase only"
fi
venv=${RECOMPOSE_VENV:-/opt/torch/.venv}
# meson and ninja may be installed in the venv only (pip install meson ninja).
[ -d "$venv/bin" ] && export PATH="$PATH:$venv/bin"
for tool in meson ninja c++; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH or in $venv/bin"
done
meson_version=$(meson --version)
[ "$(printf '%s\n1.0.0\n' "$meson_version" | sort -V | head -n1)" = 1.0.0 ] ||
  die "meson $meson_version is too old (need >= 1.0)"
if [ "$rehearsal" = 1 ]; then
  # The CPU rehearsal: this machine's LibTorch and build, none of the GPU's tools.
  torch_dir=$(bash scripts/setup.sh | tail -n1)
  CUDA_PATH=""
  setup_args=(--buildtype=release -Dtorch_dir="$torch_dir")
else
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

# doctest and range-v3: carried in .carry/include, or installed on this machine.
setup_args=(--buildtype=release -Dtorch_dir="$torch_dir" -Dcuda=enabled --wrap-mode=nodownload)
if [ -f .carry/include/doctest/doctest.h ] && [ -f .carry/include/range/v3/view/enumerate.hpp ]; then
  setup_args+=(-Dcpp_args="-I$PWD/.carry/include")
else
  for header in doctest/doctest.h range/v3/view/enumerate.hpp; do
    echo "#include <$header>" | c++ -x c++ -std=c++20 -fsyntax-only - >/dev/null 2>&1 ||
      die "$header not found (offline): run 'bash scripts/gpu-run.sh --prepare' on an online machine and carry .carry"
  done
fi
fi  # not the rehearsal

out=${OUT:-gpu-out}
mkdir -p "$out"
phase=${1:-all}
case "$phase" in all|build|test|bench|gpt|offload|compile|sharded|verdict) ;; *) die "unknown phase '$phase' (all, build, test, bench, gpt, offload, compile, sharded or verdict)" ;; esac
log="$out/gpu-run-$phase$([ "$rehearsal" = 1 ] && echo -cpu-rehearsal)-$(date -u +%Y%m%dT%H%M%SZ).txt"
build=build-gpu
[ "$rehearsal" = 1 ] && build=${RECOMPOSE_BUILD_DIR:-build}
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

do_build() {  # [ninja target...] (default: the whole tree)
  stamp "build${*:+ of $*}"
  # A fresh checkout has no build-gpu: plain setup (meson 1.0 refuses --wipe on a missing
  # folder); later runs reconfigure in place and rebuild only what changed. The CPU rehearsal
  # keeps the build folder as this machine configured it.
  if [ -f "$build/build.ninja" ]; then
    [ "$rehearsal" = 1 ] || meson setup --reconfigure "$build" "${setup_args[@]}" >/dev/null
  else
    rm -rf "$build"
    meson setup "$build" "${setup_args[@]}"
  fi
  [ "$rehearsal" = 1 ] || grep -q 'RECOMPOSE_WITH_CUDA' "$build/build.ninja" ||
    { echo "CUDA IS NOT ON in $build"; return 1; }
  quietly '^\[[0-9]+/[0-9]+\] (Compiling|Linking|Precompiling)' ninja -C "$build" -j "$jobs" "$@" ||
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
  # Issue 25's host time per intercepted op, in a region of a GPT block's size too (section 1 of
  # the full run above intercepts 200,000 ops in one region, where the forward trace grows large).
  case "$benches" in
    *" selective "*)
      run_step "selective_bench --device cuda --section 1 --ops 200 --reps 15" \
        "$build/examples/selective_bench/selective_bench" --device cuda --section 1 --ops 200 --reps 15 || status=1 ;;
  esac
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
  # Issue 25: where each policy's time goes, from LibTorch's Kineto profiler (host time of the
  # top-level ops per phase, the selective replays, device time, synchronisations, allocations);
  # the Chrome traces stay in $out/gpt_profile.
  for policy in none full selective; do
    run_step "gpt --policy $policy --steps 8 --profile 3 --device cuda --bf16 ${gpt_model[*]}" \
      quietly '^[a-z-]+ +[0-9]+/[0-9]+ ' "$build/examples/gpt/gpt" --policy "$policy" --steps 8 --profile 3 \
      --device cuda --bf16 --sample 0 --out "$out/gpt_profile" "${gpt_model[@]}" || status=1
  done
  run_step "gpu_compare.sh (C++ against PyTorch Python, alternating)" \
    env RECOMPOSE_GPT="$build/examples/gpt/gpt" RECOMPOSE_PYTHON="$venv/bin/python" \
    bash examples/gpt/python/gpu_compare.sh --rounds 2 --steps 10 --model "${gpt_model[*]}" || status=1
  stamp "gpt done"
  return $status
}

# Issue 27. RECOMPOSE_BIG_BATCH (default 2): batch of the 24 x 2048 model; RECOMPOSE_CAP_FRACTION
# (default 0.35): the caching allocator's cap for the memory-cap runs, of the device's memory.
gpt_big=(--layers 24 --width 2048 --heads 16 --context 2048 --batch "${RECOMPOSE_BIG_BATCH:-2}")
do_offload() {
  local status=0 policy cap_fraction cap_gib
  run_step "link probe and the CUDA cases of issue 27 (measure_link, never-stall, peak budget)" \
    "$build/tests/test_checkpoint" --test-case='measure_link*,never-stall offload on CUDA*,peak budget on CUDA*' || status=1
  # The planner's curve with the copy-window model: 'est. ms' (the model) beside 'step ms'.
  run_step "gpt --sweep --steps 20 --device cuda --bf16 ${gpt_model[*]}" \
    quietly '^sweep \(' "$build/examples/gpt/gpt" --sweep --steps 20 --device cuda --bf16 --sample 0 \
    --out "$out/gpt_sweep" "${gpt_model[@]}" || status=1
  run_step "gpt --sweep-peak --steps 20 --device cuda --bf16 ${gpt_model[*]}" \
    quietly '^sweep \(' "$build/examples/gpt/gpt" --sweep-peak --steps 20 --device cuda --bf16 --sample 0 \
    --out "$out/gpt_sweep_peak" "${gpt_model[@]}" || status=1
  # Never-stall offload against none and offload on the 12 x 1024 model, and where time goes.
  for policy in none offload offload-window; do
    run_step "gpt --policy $policy --phase-times --steps 6 --device cuda --bf16 ${gpt_model[*]}" gpt_phases "$policy" ||
      status=1
  done
  # The larger model: a wider window for offload (one run per policy: a sweep would hold every
  # run's model and optimizer at once).
  for policy in none full selective offload-window; do
    run_step "gpt --policy $policy --phase-times --steps 6 --device cuda --bf16 ${gpt_big[*]}" \
      "$build/examples/gpt/gpt" --policy "$policy" --phase-times --steps 6 --device cuda --bf16 --sample 0 \
      --out "$out/gpt_big" "${gpt_big[@]}" || status=1
  done
  # A memory cap under which no checkpointing does not fit (its run is expected to fail): full,
  # the best fixed policy and the planner at that peak, same batch.
  cap_fraction=${RECOMPOSE_CAP_FRACTION:-0.35}
  cap_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n1 |
    awk -v f="$cap_fraction" '{printf "%.1f", $1 * f / 1024 * 0.95}')
  stamp "memory cap: $cap_fraction of the device; planner budget peak=${cap_gib}GiB"
  for policy in none full selective every-second-mm; do
    run_step "gpt --policy $policy --memory-fraction $cap_fraction ${gpt_big[*]}" \
      "$build/examples/gpt/gpt" --policy "$policy" --memory-fraction "$cap_fraction" --phase-times --steps 6 \
      --device cuda --bf16 --sample 0 --out "$out/gpt_cap" "${gpt_big[@]}" ||
      [ "$policy" = none ] || status=1
  done
  run_step "gpt --budget peak=${cap_gib}GiB --memory-fraction $cap_fraction ${gpt_big[*]}" \
    "$build/examples/gpt/gpt" --budget "peak=${cap_gib}GiB" --memory-fraction "$cap_fraction" --phase-times \
    --steps 6 --device cuda --bf16 --sample 0 --out "$out/gpt_cap_planned" "${gpt_big[@]}" || status=1
  echo "elsewhere: examples/sharded on CUDA is the sharded phase; the Python peer under"
  echo "torch.compile's activation_memory_budget is the compile phase"
  stamp "offload done"
  return $status
}

# Issue 27: the same GPT in Python under torch.compile, per activation_memory_budget (the
# partitioner's own recomputation), each a fresh compile from the same weights and batches.
do_compile() {
  local status=0
  run_step "gpt_peer.py --compile-budgets ${RECOMPOSE_COMPILE_BUDGETS:-1.0,0.75,0.5,0.3,0.0} --device cuda --bf16 ${gpt_model[*]}" \
    "$venv/bin/python" examples/gpt/python/gpt_peer.py --quiet --compile-budgets "${RECOMPOSE_COMPILE_BUDGETS:-1.0,0.75,0.5,0.3,0.0}" \
    --device cuda --bf16 --steps 12 --threads 0 "${gpt_model[@]}" || status=1
  stamp "compile done"
  return $status
}

# Issue 27: the sharded trainer on the GPU (examples/sharded/gpu_check.sh).
do_sharded() {
  local status=0
  run_step "examples/sharded/gpu_check.sh $build/examples/sharded/sharded_trainer" \
    bash examples/sharded/gpu_check.sh "$build/examples/sharded/sharded_trainer" || status=1
  stamp "sharded done"
  return $status
}

# Issue 35: the verdict (see the header). Each step under `timeout` (a hung step cannot eat the
# call), its figures in the log as it ends. At most 8 files come back from the device machine, so
# the runs write into $build/verdict and only the tables and the selective trace are copied to
# $out beside the log.
do_verdict() {
  local status=0 dev=cuda precision=(--bf16) model=("${gpt_model[@]}") steps=10 sweep_steps=20
  local scratch="$build/verdict" gpt="$build/examples/gpt/gpt"
  local bench="$build/examples/selective_bench/selective_bench" policy trace
  if [ "$rehearsal" = 1 ]; then
    dev=cpu precision=() model=(--layers 2 --width 64 --heads 4 --context 64 --batch 4) steps=4 sweep_steps=4
  fi
  local run=(--device "$dev" "${precision[@]}" --sample 0)
  rm -rf "$scratch"
  mkdir -p "$scratch"
  do_build tests/test_checkpoint examples/gpt/gpt examples/selective_bench/selective_bench || return 1
  stamp "verdict: --device $dev ${precision[*]} ${model[*]}"
  # 1. --no-skip: a binary that sees no CUDA device fails these cases instead of skipping them.
  if [ "$rehearsal" = 1 ]; then
    run_step "the CUDA suites of test_checkpoint (rehearsal: counted, not run)" \
      timeout 60 "$build/tests/test_checkpoint" --test-suite='cuda*' --count || status=1
  else
    run_step "the CUDA suites of test_checkpoint (--test-suite='cuda*' --no-skip)" \
      timeout -k 10 150 "$build/tests/test_checkpoint" --test-suite='cuda*' --no-skip || status=1
  fi
  # 2. Every policy, interleaved step by step; the ratios are of medians.
  run_step "gpt --compare --steps $steps ${run[*]} ${model[*]}" \
    timeout -k 10 150 "$gpt" --compare --steps "$steps" "${run[@]}" --out "$scratch/compare" "${model[@]}" ||
    status=1
  cp "$scratch/compare/compare.csv" "$out/verdict-compare.csv" 2>/dev/null || true
  # 3. The planner's curve: 'est. ms' (the cost model) beside 'step ms' at every budget.
  run_step "gpt --sweep --steps $sweep_steps ${run[*]} ${model[*]}" \
    quietly '^sweep \(' timeout -k 10 180 "$gpt" --sweep --steps "$sweep_steps" "${run[@]}" \
    --out "$scratch/sweep" "${model[@]}" || status=1
  cp "$scratch/sweep/sweep.csv" "$out/verdict-sweep.csv" 2>/dev/null || true
  cp "$scratch/sweep/sweep.svg" "$out/verdict-sweep.svg" 2>/dev/null || true
  # 4. Host time per intercepted op in a region of a GPT block's size.
  run_step "selective_bench --device $dev --section 1 --ops 200 --reps 15" \
    timeout -k 10 60 "$bench" --device "$dev" --section 1 --ops 200 --reps 15 || status=1
  # 5. Where a selective step's time goes (the replays are recompose::selective_replay spans),
  # then none and full beside it.
  for policy in selective none full; do
    run_step "gpt --policy $policy --steps 8 --profile 3 ${run[*]} ${model[*]}" \
      quietly '^[a-z-]+ +[0-9]+/[0-9]+ ' timeout -k 10 90 "$gpt" --policy "$policy" --steps 8 --profile 3 \
      "${run[@]}" --out "$scratch/profile" "${model[@]}" || status=1
  done
  trace="$scratch/profile/profile-selective.json"
  [ -f "$trace" ] && gzip -c "$trace" >"$out/verdict-profile-selective.json.gz" || true
  # 6. The replay's host time against the ops it ran, one GPT-like block per region.
  run_step "selective_bench --device $dev --section 3" \
    timeout -k 10 90 "$bench" --device "$dev" --section 3 || status=1
  stamp "verdict done: $SECONDS s in all"
  return $status
}

main() {
  local status=0
  echo "date: $(date -u)"
  if [ "$rehearsal" = 1 ]; then
    echo "device: none (the CPU rehearsal of the verdict phase)"
  else
    echo "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
  fi
  echo "torch: $torch_dir ($(grep -h '^__version__' "$torch_dir/version.py" | head -n1))"
  [ -z "$CUDA_PATH" ] || echo "CUDA toolkit: $CUDA_PATH ($("$CUDA_PATH/bin/nvcc" --version | tail -n1))"
  echo "meson $meson_version, ninja $(ninja --version), $(c++ --version | head -n1), $(nproc) cores"
  echo "command: bash scripts/gpu-run.sh $phase ($(git rev-parse --short HEAD 2>/dev/null || echo no git)$(git diff --quiet 2>/dev/null || echo ', with local changes'))"
  [ "$phase" = verdict ] || do_build || return 1
  case "$phase" in
    all) do_test || status=1; do_bench || status=1; do_gpt || status=1 ;;
    test) do_test || status=1 ;;
    bench) do_bench || status=1 ;;
    gpt) do_gpt || status=1 ;;
    offload) do_offload || status=1 ;;
    compile) do_compile || status=1 ;;
    sharded) do_sharded || status=1 ;;
    verdict) do_verdict || status=1 ;;
  esac
  if [ $status -eq 0 ]; then echo "gpu-run: all passed"; else echo "gpu-run: FAILURES above"; fi
  return $status
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
