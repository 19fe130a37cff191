#!/usr/bin/env bash
# Two builds of region_cost_bench side by side on one machine: runs them in alternation
# (ROUNDS times each, so that load from other processes falls on both alike) and prints, per
# variant, the median over the rounds of each binary's "- body" column (overhead for offload).
#
#   bash examples/region_cost_bench/compare.sh OLD_BINARY NEW_BINARY [ROUNDS=5] [bench flags...]
set -euo pipefail
old=$1 new=$2 rounds=${3:-5}
shift $(( $# < 3 ? $# : 3 ))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  OMP_NUM_THREADS=1 "$old" "$@" > "$tmp/old.$r"
  OMP_NUM_THREADS=1 "$new" "$@" > "$tmp/new.$r"
done
python3 - "$tmp" "$rounds" <<'PY'
import statistics, sys, re
tmp, rounds = sys.argv[1], int(sys.argv[2])
def table(path):
    rows = {}
    for line in open(path):
        m = re.match(r"^(\s*\S.*?)\s{2,}(-?[\d.]+)(?:\s+(-?[\d.]+))?(?:\s+(-?[\d.]+|-))?\s*$", line)
        if not m or line.startswith(("per region", "recompose")): continue
        name, time, over, body = m.group(1), m.group(2), m.group(3), m.group(4)
        rows[name] = float(body if body not in (None, "-") else (over if over else time))
    return rows
old = [table(f"{tmp}/old.{r}") for r in range(1, rounds + 1)]
new = [table(f"{tmp}/new.{r}") for r in range(1, rounds + 1)]
print(f"medians over {rounds} alternating runs of each binary (us per region; '- body', offload: overhead, plain: time)")
print(f"{'variant':32s} {'old':>9s} {'new':>9s} {'change':>9s}")
for name in old[0]:
    o = statistics.median(t[name] for t in old if name in t)
    n = statistics.median(t[name] for t in new if name in t)
    print(f"{name:32s} {o:9.2f} {n:9.2f} {n - o:+9.2f}")
PY
