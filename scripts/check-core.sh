#!/usr/bin/env bash
# Builds and tests the core-only variant: no selective checkpointing, no activation swap, no
# CUDA (docs/architecture.md, "Optional components"), in ./build-core (or $RECOMPOSE_BUILD_DIR).
# Extra arguments go to `meson setup`, e.g. -Dswap=enabled for the engine + swap variant.
#   bash scripts/check-core.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RECOMPOSE_BUILD_DIR=${RECOMPOSE_BUILD_DIR:-build-core}
bash scripts/build.sh -Dselective=disabled -Dswap=disabled -Dcuda=disabled "$@"
meson test -C "$RECOMPOSE_BUILD_DIR" --print-errorlogs --num-processes 1
