#!/usr/bin/env bash
# The LibTorch version matrix: for each version, installs it (scripts/setup.sh with
# RECOMPOSE_TORCH_VERSION: the wheel is fetched once into ~/.cache/recompose, then reused), builds
# everything, runs the whole test suite (meson test) and ends with a table of the build time, test
# time and doctest totals per version. Exits non-zero if any version failed to set up, build or
# pass. CI builds one version only (scripts/test.sh); this is the check to run when the adapters
# or the version list change.
#
#   bash scripts/test-versions.sh                  # every version of scripts/torch-versions.sh
#   bash scripts/test-versions.sh 2.10.0 2.11.0    # some of them
#
# Build folder: ./build when it is already configured with that version's LibTorch (the default
# one, usually), else build-torch-<version>; an existing folder is reused, so a second run only
# rebuilds what changed. Build seconds are ninja's on that folder: a clean build the first time
# (`ninja -C <folder> -t clean` for another), faster when ccache already holds the objects.
# Environment: RECOMPOSE_JOBS (ninja jobs, default nproc); RECOMPOSE_DEPS as for scripts/setup.sh.
# Each version's output goes to <folder>/test-versions.log as well.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch-versions.sh

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("${RECOMPOSE_TORCH_VERSIONS[@]}")
jobs=${RECOMPOSE_JOBS:-$(nproc)}
rows=()
status=0

# The LibTorch folder an existing build folder was configured with (empty if none).
configured_torch_dir() {
  local info=$1/meson-info/intro-buildoptions.json
  [ -f "$info" ] || return 0
  python3 -c 'import json, sys
print(next((o["value"] for o in json.load(open(sys.argv[1])) if o["name"] == "torch_dir"), ""))' "$info"
}

# Where `version` builds: ./build if it already uses that LibTorch, else its own folder.
build_folder() {
  local torch_dir=$1 version=$2
  if [ -n "$torch_dir" ] && [ "$(configured_torch_dir build)" = "$torch_dir" ]; then
    echo build
  else
    echo "build-torch-$version"
  fi
}

# One version: sets `row` to its line of the table; returns non-zero if anything failed.
run_version() {
  local version=$1 build torch_dir t0 t1 t2 t3 totals result=passed
  t0=$(date +%s)
  if ! torch_dir=$(RECOMPOSE_TORCH_VERSION=$version bash scripts/setup.sh | tail -n1); then
    row="$version|-|-|-|-|-|SETUP FAILED"
    return 1
  fi
  build=$(build_folder "$torch_dir" "$version")
  echo "=== LibTorch $version ($torch_dir) in $build"
  t1=$(date +%s)
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" --buildtype=release -Dtorch_dir="$torch_dir" \
      || { row="$version|$build|$((t1 - t0))|-|-|-|CONFIGURE FAILED"; return 1; }
  fi
  if ! ninja -C "$build" -j "$jobs"; then
    row="$version|$build|$((t1 - t0))|$(( $(date +%s) - t1 ))|-|-|BUILD FAILED"
    return 1
  fi
  t2=$(date +%s)
  meson test -C "$build" --no-rebuild --print-errorlogs --num-processes 1 || result="TESTS FAILED"
  t3=$(date +%s)
  totals=$(bash scripts/doctest-totals.sh "$build/meson-logs/testlog.txt" || echo "-")
  row="$version|$build|$((t1 - t0))|$((t2 - t1))|$((t3 - t2))|${totals#doctest: }|$result"
  [ "$result" = passed ]
}

for version in "${versions[@]}"; do
  echo "=== LibTorch $version: set up, build, test"
  # The row and the log must survive the pipe into tee: both go to files.
  rowfile=$(mktemp)
  logfile=$(mktemp)
  # (run_version in an `if`: its failures are reported in its row, not by set -e.)
  { row="$version|-|-|-|-|-|FAILED"; if run_version "$version"; then rc=0; else rc=1; fi
    echo "$row" > "$rowfile"; exit $rc; } 2>&1 | tee "$logfile" || status=1
  row=$(cat "$rowfile")
  rows+=("$row")
  IFS='|' read -r _ build _ <<< "$row"
  if [ -d "$build" ]; then mv "$logfile" "$build/test-versions.log"; else rm -f "$logfile"; fi
  rm -f "$rowfile"
done

echo
echo "LibTorch version matrix ($(uname -m), $(nproc) cores, ninja -j $jobs):"
printf '%-8s %-18s %7s %7s %7s  %-32s %s\n' version folder "setup s" "build s" "tests s" "doctest cases" result
for r in "${rows[@]}"; do
  IFS='|' read -r v build setup built tests totals result <<< "$r"
  printf '%-8s %-18s %7s %7s %7s  %-32s %s\n' "$v" "$build" "$setup" "$built" "$tests" "$totals" "$result"
done
exit $status
