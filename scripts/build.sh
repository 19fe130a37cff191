#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds recompose in ./build (or $RECOMPOSE_BUILD_DIR).
# Extra arguments go to `meson setup` on the first configure, e.g. -Dcuda=enabled.
# RECOMPOSE_BUILD_TARGETS="examples/gpt/gpt" builds only the named ninja targets.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_dir=$(bash scripts/setup.sh | tail -n1)
build=${RECOMPOSE_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release -Dtorch_dir="$torch_dir" "$@"
elif [ $# -gt 0 ]; then
  meson configure "$build" "$@"
fi
# Two jobs at most: each LibTorch translation unit needs 1-2 GB of memory.
read -r -a targets <<<"${RECOMPOSE_BUILD_TARGETS:-}"
ninja -C "$build" -j "${RECOMPOSE_JOBS:-$(nproc)}" "${targets[@]}"
