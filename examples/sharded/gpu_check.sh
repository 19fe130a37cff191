#!/usr/bin/env bash
# examples/sharded on a GPU (issue 27): NCCL at world 1 and Gloo at world 2 on one device, with
# and without checkpointing and offload on the blocks that carry the all-gather hooks. First
# --check against unsharded training on the same device (small model), then a larger model for
# the times: ms per step, the collectives' time and the offload copies' time against it.
#
#   bash examples/sharded/gpu_check.sh [path/to/sharded_trainer]
#
# Default binary: $RECOMPOSE_SHARDED, else build-gpu/examples/sharded/sharded_trainer (the one
# scripts/gpu-run.sh builds, with -Dcuda=enabled). RECOMPOSE_SHARDED_STEPS (default 10): steps of
# the timing runs; RECOMPOSE_SHARDED_BIG: the timing runs' model flags (default below);
# RECOMPOSE_SHARDED_RUN_TIMEOUT (default 120): seconds per run (`timeout`). Exits non-zero if a
# run failed; a build without NCCL skips the NCCL runs and says so (and fails: this script is for
# the GPU build, which should have it).
# RECOMPOSE_SHARDED_DEVICE=cpu rehearses the same runs on the CPU (scripts/gpu-run.sh cap under
# RECOMPOSE_REHEARSAL=1): Gloo at world 1 stands in for NCCL, which needs CUDA.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

exe=${1:-${RECOMPOSE_SHARDED:-$root/build-gpu/examples/sharded/sharded_trainer}}
[ -x "$exe" ] || { echo "gpu_check: no sharded_trainer at '$exe' (build with -Dcuda=enabled first)" >&2; exit 2; }
steps=${RECOMPOSE_SHARDED_STEPS:-10}
device=${RECOMPOSE_SHARDED_DEVICE:-cuda}
run_timeout=${RECOMPOSE_SHARDED_RUN_TIMEOUT:-120}
# ~35M parameters in 8 blocks of width 1024; batch 512 per rank: the blocks save ~20 MB each.
read -r -a big <<<"${RECOMPOSE_SHARDED_BIG:---blocks 8 --width 1024 --hidden 4096 --batch 512}"
status=0

# The lines worth keeping from a run: configuration, collective counts and times, offload, check.
keep='^(sharded_trainer:|collectives|  all-gather|  reduce-scatter|  redundant|  [0-9.]+ MB moved|time:|offload on|  to host|  back |  stayed|  host waited|  against|sharded check|  \[FAIL\])'

run() {  # heading args...
  local heading=$1 out rc
  shift
  echo "== $heading"
  out=$(timeout -k 5 $((run_timeout + 10)) "$exe" "$@" 2>&1)  # the launcher's own --timeout first
  rc=$?
  grep -E "$keep" <<<"$out"
  if [ $rc -ne 0 ]; then
    echo "FAILED (exit $rc): $exe $*"
    tail -n 20 <<<"$out" | grep -v -E "$keep" | sed 's/^/    /'
    status=1
  fi
}

if ! probe=$(timeout -k 5 "$run_timeout" "$exe" --device "$device" --world 1 --steps 1 2>&1); then
  echo "gpu_check: this build or machine cannot train on $device:" >&2
  grep -m 3 . <<<"$probe" | sed 's/^/    /' >&2
  exit 2
fi
if [ "$device" = cuda ]; then
  backends=("nccl --world 1" "gloo --world 2")
  if ! timeout -k 5 "$run_timeout" "$exe" --device cuda --backend nccl --world 1 --steps 1 >/dev/null 2>&1; then
    echo "gpu_check: NCCL does not run with this build or machine:"
    timeout -k 5 "$run_timeout" "$exe" --device cuda --backend nccl --world 1 --steps 1 2>&1 | head -n 3 | sed 's/^/    /'
    backends=("gloo --world 2")
    status=1
  fi
else
  echo "gpu_check: on $device (rehearsal): Gloo at world 1 stands in for NCCL, which needs CUDA"
  backends=("gloo --world 1" "gloo --world 2")
fi

for b in "${backends[@]}"; do
  read -r -a backend <<<"--backend $b"
  for checkpoint in none full; do
    for offload in "" --offload; do
      run "check: ${backend[*]} --checkpoint $checkpoint${offload:+ $offload} --steps 3 --check" \
        --device "$device" "${backend[@]}" --checkpoint "$checkpoint" $offload --steps 3 --check
    done
  done
done

for b in "${backends[@]}"; do
  read -r -a backend <<<"--backend $b"
  for checkpoint in none full; do
    for offload in "" --offload; do
      run "time: ${backend[*]} --checkpoint $checkpoint${offload:+ $offload} ${big[*]} --steps $steps" \
        --device "$device" "${backend[@]}" --checkpoint "$checkpoint" $offload --steps "$steps" "${big[@]}" --timeout "$run_timeout"
    done
  done
done

if [ $status -eq 0 ]; then echo "gpu_check: all passed"; else echo "gpu_check: FAILURES above"; fi
exit $status
