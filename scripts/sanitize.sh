#!/usr/bin/env bash
# Builds recompose and its test suites with AddressSanitizer and UndefinedBehaviorSanitizer
# (Meson's b_sanitize) in ./build-asan (or $RECOMPOSE_ASAN_DIR) and runs every test under them.
# LibTorch itself is not instrumented; the suppression files in tests/sanitizers/ may name only
# LibTorch's own frames (none is needed with 2.11). Exits non-zero on any sanitizer report or
# test failure (LeakSanitizer included).
#
#   bash scripts/sanitize.sh                      # all test suites
#   bash scripts/sanitize.sh -ts='module state'   # extra arguments go to each doctest binary
set -euo pipefail
cd "$(dirname "$0")/.."
torch_dir=$(bash scripts/setup.sh | tail -n1)
build=${RECOMPOSE_ASAN_DIR:-build-asan}
if [ ! -f "$build/build.ninja" ]; then
  # b_lundef=false: the sanitizer runtimes are linked into executables, not into the libraries.
  meson setup "$build" --buildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
    -Dtorch_dir="$torch_dir"
fi
ninja -C "$build" -j "${RECOMPOSE_JOBS:-$(nproc)}" tests/test_hooks tests/test_checkpoint
supp="$PWD/tests/sanitizers"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="suppressions=$supp/ubsan.supp:print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
status=0
for t in test_hooks test_checkpoint; do
  echo "[sanitize] $t"
  "$build/tests/$t" "$@" || status=$?
done
[ $status -eq 0 ] && echo "[sanitize] clean: no AddressSanitizer/UBSan report, all tests passed"
exit $status
