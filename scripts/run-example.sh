#!/usr/bin/env bash
# Command (1) of the README: set up, build, and run the main example (GPT training, CPU).
# Extra arguments go to the example, e.g. --compare or --policy selective.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build=${RECOMPOSE_BUILD_DIR:-build}
if [ -x "$build/examples/gpt/gpt" ]; then
  exec "$build/examples/gpt/gpt" "$@"
fi
echo "[run-example] examples/gpt is not built; running the hook and checkpoint demos instead" >&2
"$build/examples/hooks_demo/hooks_demo"
exec "$build/examples/checkpoint_bench/checkpoint_bench" "$@"
