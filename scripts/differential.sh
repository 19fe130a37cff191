#!/usr/bin/env bash
# The long run of the randomized differential test (tests/differential_test.cpp): builds
# (scripts/build.sh), then trains 10,000 seeded random models with and without recompose and
# checks loss, gradients, parameters, buffers and the CPU generator state bitwise.
# CI (meson test) runs the quick share of 500 cases.
#
#   bash scripts/differential.sh                     # 10,000 cases from seed 1
#   RECOMPOSE_DIFF_CASES=50000 RECOMPOSE_DIFF_SEED=100000 bash scripts/differential.sh
#   RECOMPOSE_DIFF_FEATURES=-known bash scripts/differential.sh      # features that once hit bugs, off
#   RECOMPOSE_DIFF_FEATURES=help bash scripts/differential.sh        # list the feature switches
#   RECOMPOSE_DIFF_ONLY=1234 bash scripts/differential.sh            # one case, with its description
#
# The test binary is run directly (not through meson test), so meson's per-test timeout does
# not apply; doctest has none. Exits non-zero if any case differs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build=${RECOMPOSE_BUILD_DIR:-build}
export RECOMPOSE_DIFF_CASES=${RECOMPOSE_DIFF_CASES:-10000}
exec "$build/tests/test_checkpoint" -ts='differential*' "$@"
