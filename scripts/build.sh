#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds recompose in ./build (or $RECOMPOSE_BUILD_DIR).
# Extra arguments go to `meson setup` on the first configure, e.g. -Dcuda=enabled.
# A new build folder is a unity build (-Dunity=on: each group of sources one translation unit,
# about a third of the per-file build's time; docs/guide/testing.md, "Build time") unless the
# arguments set -Dunity; `meson configure build -Dunity=off` turns it off for per-file rebuilds.
# RECOMPOSE_BUILD_TARGETS="examples/gpt/gpt" builds only the named ninja targets.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_dir=$(bash scripts/setup.sh | tail -n1)
build=${RECOMPOSE_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  unity=(-Dunity=on)
  case " $* " in *" -Dunity="*) unity=() ;; esac
  meson setup "$build" --buildtype=release -Dtorch_dir="$torch_dir" "${unity[@]}" "$@"
elif [ $# -gt 0 ]; then
  meson configure "$build" "$@"
fi
# Two jobs at most: each LibTorch translation unit needs 1-2 GB of memory.
read -r -a targets <<<"${RECOMPOSE_BUILD_TARGETS:-}"
ninja -C "$build" -j "${RECOMPOSE_JOBS:-$(nproc)}" "${targets[@]}"
