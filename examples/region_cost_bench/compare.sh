#!/usr/bin/env bash
# Two builds of region_cost_bench side by side on one machine: runs them in alternation
# (ROUNDS times each, so that load from other processes falls on both alike) and prints, per
# variant, the median over the rounds of each binary's last figure: "bookkeeping" where the
# binary prints it, else "- body", else "overhead" (offload), else "time" (plain).
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
        m = re.match(r"^(\s*\S.*?)\s{2,}(-?[\d.]+(?:\s+(?:-?[\d.]+|-))*)\s*$", line)
        if not m or line.startswith(("per region", "recompose")): continue
        cells = [c for c in m.group(2).split() if c != "-"]
        rows[m.group(1)] = float(cells[-1])
    return rows
old = [table(f"{tmp}/old.{r}") for r in range(1, rounds + 1)]
new = [table(f"{tmp}/new.{r}") for r in range(1, rounds + 1)]
print(f"medians over {rounds} alternating runs of each binary (us per region; bookkeeping, else '- body', else overhead, plain: time)")
print(f"{'variant':32s} {'old':>9s} {'new':>9s} {'change':>9s}")
for name in old[0]:
    o = statistics.median(t[name] for t in old if name in t)
    n = statistics.median(t[name] for t in new if name in t)
    print(f"{name:32s} {o:9.2f} {n:9.2f} {n - o:+9.2f}")
PY
