#!/usr/bin/env bash
# Command (1) of the README: set up, build, and show recompose at work on the main example (a
# character-level GPT, CPU unless CUDA is built in and a GPU is here). From a clean clone on the
# project's 2-core machine with the LibTorch wheel cached: 110-111 s (build ~76 s, example ~34 s):
#   1. every policy (none, full, selective, swap) for 20 steps from the same seed, one table:
#      identical losses, and the memory each policy holds for backward;
#   2. training with selective checkpointing (transformer_policy on every block).
# With arguments, runs the example with them instead, e.g. --policy full --steps 500.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the example and the library it links: the tests are command (2)'s.
echo "[run-example] setting up and building the GPT example (examples/gpt/gpt and the library)"
RECOMPOSE_BUILD_TARGETS=examples/gpt/gpt bash scripts/build.sh
build=${RECOMPOSE_BUILD_DIR:-build}
gpt="$build/examples/gpt/gpt"
if [ ! -x "$gpt" ]; then
  echo "[run-example] $gpt is not built (configured with -Dexamples=disabled?)" >&2
  exit 1
fi
if [ $# -gt 0 ]; then
  exec "$gpt" "$@"
fi
echo "[run-example] 1/2: every checkpointing policy, same seed, 20 steps: gpt --compare --steps 20"
"$gpt" --compare --steps 20 --sample 0
echo
echo "[run-example] 2/2: training with selective checkpointing: gpt --policy selective --steps 200"
exec "$gpt" --policy selective --steps 200
