#!/usr/bin/env bash
# The LibTorch version matrix: for each version, installs it (scripts/setup.sh with
# RECOMPOSE_TORCH_VERSION), builds everything in build-torch-<version>, runs the whole test suite
# (meson test) and ends with a table of the build time, test time and doctest totals per version.
# Exits non-zero if any version failed to set up, build or pass. CI builds one version only
# (scripts/test.sh); this is the check to run when the adapters or the version list change.
#
#   bash scripts/test-versions.sh                  # every version of scripts/torch-versions.sh
#   bash scripts/test-versions.sh 2.10.0 2.11.0    # some of them
#
# Environment: RECOMPOSE_JOBS (ninja jobs, default nproc); RECOMPOSE_DEPS as for scripts/setup.sh.
# Each version's output goes to build-torch-<version>/test-versions.log as well.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch-versions.sh

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("${RECOMPOSE_TORCH_VERSIONS[@]}")
jobs=${RECOMPOSE_JOBS:-$(nproc)}
rows=()
status=0

# One version: sets `row` to its line of the table; returns non-zero if anything failed.
run_version() {
  local version=$1 build=build-torch-$1 torch_dir t0 t1 t2 t3 totals="-" result=passed
  t0=$(date +%s)
  if ! torch_dir=$(RECOMPOSE_TORCH_VERSION=$version bash scripts/setup.sh | tail -n1); then
    row="$version|-|-|-|-|SETUP FAILED"
    return 1
  fi
  t1=$(date +%s)
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" --buildtype=release -Dtorch_dir="$torch_dir" || { row="$version|$((t1 - t0))|-|-|-|CONFIGURE FAILED"; return 1; }
  fi
  if ! ninja -C "$build" -j "$jobs"; then
    row="$version|$((t1 - t0))|$(( $(date +%s) - t1 ))|-|-|BUILD FAILED"
    return 1
  fi
  t2=$(date +%s)
  meson test -C "$build" --no-rebuild --print-errorlogs --num-processes 1 || result="TESTS FAILED"
  t3=$(date +%s)
  totals=$(bash scripts/doctest-totals.sh "$build/meson-logs/testlog.txt" || echo "-")
  row="$version|$((t1 - t0))|$((t2 - t1))|$((t3 - t2))|${totals#doctest: }|$result"
  [ "$result" = passed ]
}

for version in "${versions[@]}"; do
  echo "=== LibTorch $version: set up, build in build-torch-$version, test"
  mkdir -p "build-torch-$version"
  # The table row must survive the pipe into tee: write it to a file.
  rowfile=$(mktemp)
  # (run_version in an `if`: its failures are reported in its row, not by set -e.)
  { row="$version|-|-|-|-|FAILED"; if run_version "$version"; then rc=0; else rc=1; fi
    echo "$row" > "$rowfile"; exit $rc; } 2>&1 | tee "build-torch-$version/test-versions.log" || status=1
  rows+=("$(cat "$rowfile")")
  rm -f "$rowfile"
done

echo
echo "LibTorch version matrix ($(uname -m), $(nproc) cores, ninja -j $jobs):"
printf '%-9s %8s %8s %8s  %-38s %s\n' version "setup s" "build s" "tests s" "doctest cases" result
for r in "${rows[@]}"; do
  IFS='|' read -r v setup build tests totals result <<< "$r"
  printf '%-9s %8s %8s %8s  %-38s %s\n' "$v" "$setup" "$build" "$tests" "$totals" "$result"
done
exit $status
