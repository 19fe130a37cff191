#!/usr/bin/env bash
# Builds recompose and its test suites with sanitizers (Meson's b_sanitize) and runs the tests
# under them. Two modes:
#
#   address (the default): AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included)
#     in ./build-asan (or $RECOMPOSE_ASAN_DIR). Runs every case of test_hooks and test_checkpoint,
#     the differential suite with RECOMPOSE_SANITIZE_DIFF_CASES random cases (default 2,000,
#     where `meson test` runs 500) and its planned share (RECOMPOSE_DIFF_PLAN_CASES, default 300).
#   thread: ThreadSanitizer in ./build-tsan (or $RECOMPOSE_TSAN_DIR). Runs every case of
#     test_hooks and test_checkpoint but the differential suite (single-threaded, and covered by
#     the address mode): the threaded ones among them (several threads forwarding through hooked
#     modules while others die, recomputing, swapping, destroying ledgers and interceptors at
#     once). A race shows only when the threads meet, so each binary runs
#     RECOMPOSE_SANITIZE_RUNS times (default 5 here, 1 in the address mode); a run takes seconds.
#
# LibTorch itself is not instrumented. The suppression files in tests/sanitizers/ may name only
# LibTorch's or the runtime's own code, never recompose's (with 2.11: one LibTorch function in
# tsan.supp, none in the others). The thread mode runs LibTorch's intra-op pool with one thread
# (OMP_NUM_THREADS=1; recompose runs none of its code there): its OpenMP threads synchronize in
# uninstrumented code, and TSan reports the memset/memcpy of its kernels as races. Exits non-zero
# on any sanitizer report (the logs are searched for one too, in case a runtime let the process
# exit 0) or test failure.
# Each binary's output is also written to <build>/sanitize-<test>.log (every run); the last lines
# printed are the doctest totals and the differential counts (each distinct line once).
#
#   bash scripts/sanitize.sh                      # ASan+UBSan: all suites, 2,000 + 300 differential cases
#   bash scripts/sanitize.sh thread               # TSan: all suites but the differential
#   bash scripts/sanitize.sh -ts='module state'   # extra arguments go to each doctest binary
#   bash scripts/sanitize.sh thread -tc='*thread*'
#   RECOMPOSE_SANITIZE_DIFF_CASES=10000 bash scripts/sanitize.sh -ts=differential
set -euo pipefail
cd "$(dirname "$0")/.."
mode=address
case "${1:-}" in
  address | thread) mode=$1; shift ;;
esac
torch_dir=$(bash scripts/setup.sh | tail -n1)
supp="$PWD/tests/sanitizers"
extra=()
runs=${RECOMPOSE_SANITIZE_RUNS:-1}
if [ "$mode" = address ]; then
  build=${RECOMPOSE_ASAN_DIR:-build-asan}
  sanitize=address,undefined
  export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:${ASAN_OPTIONS:-}"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
  export UBSAN_OPTIONS="suppressions=$supp/ubsan.supp:print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
  export RECOMPOSE_DIFF_CASES=${RECOMPOSE_SANITIZE_DIFF_CASES:-2000}
  export RECOMPOSE_DIFF_PLAN_CASES=${RECOMPOSE_DIFF_PLAN_CASES:-300}
else
  build=${RECOMPOSE_TSAN_DIR:-build-tsan}
  sanitize=thread
  # exitcode: a run with a report exits non-zero even though TSan lets it go on to the end.
  export TSAN_OPTIONS="suppressions=$supp/tsan.supp:print_suppressions=0:second_deadlock_stack=1:exitcode=66:${TSAN_OPTIONS:-}"
  export OMP_NUM_THREADS=1
  extra=(-tse=differential)
  runs=${RECOMPOSE_SANITIZE_RUNS:-5}
fi
if [ ! -f "$build/build.ninja" ]; then
  # b_lundef=false: the sanitizer runtimes are linked into executables, not into the libraries.
  # -Dunity=on as scripts/build.sh: about a third of the per-file build's time.
  meson setup "$build" --buildtype=debugoptimized -Db_sanitize=$sanitize -Db_lundef=false \
    -Dunity=on -Dtorch_dir="$torch_dir"
fi
ninja -C "$build" -j "${RECOMPOSE_JOBS:-$(nproc)}" tests/test_hooks tests/test_checkpoint
status=0
for t in test_hooks test_checkpoint; do
  log="$build/sanitize-$t.log"
  : >"$log"
  for ((run = 1; run <= runs; run++)); do
    echo "[sanitize] $mode: $t (run $run of $runs)" | tee -a "$log"
    "$build/tests/$t" "${extra[@]}" "$@" 2>&1 | tee -a "$log" || status=$?
  done
  if grep -qE '^(==[0-9]+==)?(ERROR|WARNING): (Address|Leak|Thread)Sanitizer|runtime error:' "$log"; then
    echo "[sanitize] $t: a sanitizer report (see $log)"
    [ $status -ne 0 ] || status=1
  fi
done
echo "[sanitize] $mode: summary"
for t in test_hooks test_checkpoint; do
  grep -hE '^\[doctest\] (test cases|assertions)|^\[(planned )?differential\] ((cpu: )?[0-9]+ cases|drew:)' \
    "$build/sanitize-$t.log" | awk '!seen[$0]++' | sed "s/^/[sanitize] $t: /" || true
done
[ $status -eq 0 ] && echo "[sanitize] $mode: clean: no sanitizer report, all tests passed ($runs run(s) each)"
exit $status
