#!/usr/bin/env bash
# Command (2) of the README: set up, build, run every test, then the consumer tests (recompose
# installed into a temporary folder and used from pkg-config, CMake and Meson: tests/consumers).
# Exits non-zero if any test fails. RECOMPOSE_CONSUMERS=none skips the consumer tests.
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
echo "[test] build $((built - start)) s, tests $((done_at - built)) s, consumer tests $((consumers_at - done_at)) s ($consumers)"
# The totals again as the closing line, which CI reads.
echo "$totals"
exit $status
