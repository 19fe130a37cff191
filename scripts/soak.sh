#!/usr/bin/env bash
# Soak: trains the GPT example for many steps under every policy and samples the process's
# resident set size (VmRSS) as it goes. A flat RSS after warm-up means nothing grows per step
# (no leak in frames, swap groups, registries or pools).
#
#   bash scripts/soak.sh                 # 3000 steps per policy, small model
#   STEPS=500 POLICIES="swap" bash scripts/soak.sh
#
# Prints, per policy, the median RSS over 10-20% of the run (after warm-up) and over its last
# 10%, and the growth per 1000 steps between them. Builds first (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
build=${RECOMPOSE_BUILD_DIR:-build}
steps=${STEPS:-3000}
policies=${POLICIES:-"none full selective swap"}
model=(--layers 2 --width 64 --heads 4 --context 32 --batch 8 --threads 1 --dropout 0.1)
out=$(mktemp -d)
printf '%-10s %8s %14s %14s %18s\n' policy steps "rss@10-20% KiB" "rss@90-100% KiB" "growth/1000 steps"
for policy in $policies; do
  "$build/examples/gpt/gpt" --policy "$policy" --steps "$steps" "${model[@]}" --out "$out/$policy" \
    >"$out/$policy.log" 2>&1 &
  pid=$!
  samples="$out/$policy.rss"
  : >"$samples"
  start=$(date +%s.%N)
  while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$rss" ] && echo "$(date +%s.%N) $rss" >>"$samples"
    sleep 0.5
  done
  wait "$pid" || { echo "gpt --policy $policy failed:"; tail -20 "$out/$policy.log"; exit 1; }
  # Samples are in time; steps run at a steady rate, so time stands in for the step count.
  python3 - "$samples" "$policy" "$steps" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
policy, steps = sys.argv[2], int(sys.argv[3])
t0, t1 = rows[0][0], rows[-1][0]
def window(a, b):  # samples between fractions a and b of the run (time stands in for steps)
    w = [r[1] for r in rows if t0 + a * (t1 - t0) <= r[0] <= t0 + b * (t1 - t0)]
    return statistics.median(w) if w else float("nan")
# Medians of windows, not single samples: RSS jitters by a MiB or so as the allocator works.
early, late = window(0.10, 0.20), window(0.90, 1.00)
growth = (late - early) / (0.8 * steps) * 1000
print(f"{policy:<10} {steps:8d} {int(early):14d} {int(late):14d} {growth:15.1f} KiB")
PY
done
rm -rf "$out"
