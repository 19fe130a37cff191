#!/usr/bin/env bash
# Command (2) of the README: set up, build, run every test, then the consumer tests (recompose
# installed into a temporary folder and used from pkg-config, CMake and Meson: tests/consumers), then
# the CUDA compile check (scripts/check-cuda-compile.sh; no GPU needed).
# Exits non-zero if any test fails. RECOMPOSE_CONSUMERS=none skips the consumer tests,
# RECOMPOSE_CUDA_COMPILE=none the CUDA compile check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/check-layering.sh  # every include respects docs/architecture.md
start=$(date +%s)
bash scripts/build.sh
built=$(date +%s)
build=${RECOMPOSE_BUILD_DIR:-build}
status=0
meson test -C "$build" --print-errorlogs --num-processes 1 || status=$?
done_at=$(date +%s)
# meson prints its own summary; add the doctest totals as one plain line that CI can read.
totals=$(bash scripts/doctest-totals.sh "$build/meson-logs/testlog.txt" || true)
echo "$totals"
consumers=skipped
if [ "${RECOMPOSE_CONSUMERS:-}" != none ]; then
  echo "[test] consumer tests: install into a temporary folder, then pkg-config, CMake, Meson"
  if bash tests/consumers/run.sh "$build"; then consumers=passed; else consumers=FAILED; status=1; fi
fi
consumers_at=$(date +%s)
# The code only the CUDA build compiles (RECOMPOSE_WITH_CUDA, SHARDED_WITH_NCCL), compiled here,
# syntax only: a compile error there would otherwise first show on a GPU machine.
# RECOMPOSE_CUDA_COMPILE=none skips it.
cuda_compile=skipped
if [ "${RECOMPOSE_CUDA_COMPILE:-}" != none ]; then
  echo "[test] CUDA compile check: the code only the CUDA build compiles (scripts/check-cuda-compile.sh)"
  rc=0
  bash scripts/check-cuda-compile.sh || rc=$?
  case $rc in
    0) cuda_compile=passed ;;
    2) cuda_compile="not possible here" ;;
    *) cuda_compile=FAILED; status=1 ;;
  esac
fi
cuda_at=$(date +%s)
echo "[test] build $((built - start)) s, tests $((done_at - built)) s, consumer tests $((consumers_at - done_at)) s ($consumers), CUDA compile check $((cuda_at - consumers_at)) s ($cuda_compile)"
# The totals again as the closing line, which CI reads.
echo "$totals"
exit $status
