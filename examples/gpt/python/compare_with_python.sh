#!/usr/bin/env bash
# C++ (the GPT example, as shipped) against PyTorch 2.11 in Python (gpt_peer.py): same model,
# weights, batches and dropout draws, 1 thread, runs alternating, per policy none/full/selective.
# Also runs the C++ example with glibc's malloc defaults (RECOMPOSE_MALLOC_TUNING=0), to show what
# examples/common/allocator_tuning.h saves. The first round checks Python's losses against the C++
# run's (gpt_peer.py --check-losses: fails beyond 1e-3 relative; prints how many agree to 9 digits).
#
#   bash examples/gpt/python/compare_with_python.sh [--rounds 5] [--steps 20] [--large-steps 10]
#       [--models default,large]
#
# Prints, per model and policy, the median step time (wall and CPU, ms; mean over the steps of a
# run without the first) and page faults per step of each side, and C++/Python step-time ratios. Needs build/examples/gpt/gpt (or
# RECOMPOSE_GPT) and the Python peer (scripts/setup-python-peer.sh, run if missing).
set -euo pipefail

root="$(cd "$(dirname "$0")/../../.." && pwd)"
gpt="${RECOMPOSE_GPT:-$root/build/examples/gpt/gpt}"
peer="$root/examples/gpt/python/gpt_peer.py"
rounds=5
steps=20
large_steps=10  # the large model's steps are about 4 times longer
models="default,large"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --large-steps) large_steps="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--steps N] [--large-steps N] [--models default,large]" >&2; exit 2 ;;
  esac
done
[ -x "$gpt" ] || { echo "no $gpt: build it first (ninja -C build examples/gpt/gpt)" >&2; exit 1; }
python="$(bash "$root/scripts/setup-python-peer.sh" | tail -1)"

export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

model_flags() {
  case "$1" in
    default) echo "" ;;                                         # 4 blocks, width 128, context 64
    large) echo "--layers 8 --width 256 --context 128" ;;
    *) echo "unknown model $1" >&2; exit 2 ;;
  esac
}

# One C++ run; prints "<step ms> <CPU ms> <page faults per step>".
run_cpp() {  # policy out-dir malloc(tuned|default) flags...
  local policy="$1" out="$2" malloc="$3"; shift 3
  local env=()
  [ "$malloc" = default ] && env=(RECOMPOSE_MALLOC_TUNING=0)
  env "${env[@]}" "$gpt" --policy "$policy" --steps "$steps" --threads 1 --sample 0 --out "$out" "$@" >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; exit 1; }
  awk '/^  step time/ {ms=$3} /^  CPU time/ {cpu=$3} /^  page faults/ {pf=$3} END {print ms, cpu, pf}' "$out.log"
}

# One Python run; prints "<step ms> <CPU ms> <page faults per step>".
run_py() {  # policy state check-csv flags...
  local policy="$1" state="$2" check="$3"; shift 3
  local extra=()
  [ -n "$check" ] && extra=(--check-losses "$check")
  "$python" "$peer" --quiet --state "$state" --policy "$policy" --steps "$steps" --threads 1 "${extra[@]}" "$@" \
    >"$work/py.log" 2>&1 || { cat "$work/py.log" >&2; exit 1; }
  [ -n "$check" ] && echo "$policy: $(grep '^losses against' "$work/py.log")" >&2
  sed -n 's/.*mean step \([0-9.]*\) ms (CPU \([0-9.]*\) ms.*, \([0-9]*\) page faults per step.*/\1 \2 \3/p' "$work/py.log"
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

# The LibTorch the build links (meson option torch_dir), for the header line.
libtorch="$(python3 - "$(dirname "$gpt")/../../meson-info/intro-buildoptions.json" <<'PY' 2>/dev/null || echo unknown
import json, re, sys
d = [o["value"] for o in json.load(open(sys.argv[1])) if o["name"] == "torch_dir"][0]
print(re.search(r"__version__ = '([^']*)'", open(d + "/version.py").read()).group(1))
PY
)"
echo "C++ (LibTorch $libtorch) vs Python ($("$python" -c 'import sys, torch; print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")')), 1 thread, $rounds alternating rounds; steps per run: $steps (default model), $large_steps (large)"
IFS=, read -r -a model_list <<<"$models"
base_steps="$steps"
for model in "${model_list[@]}"; do
  read -r -a flags <<<"$(model_flags "$model")"
  steps="$base_steps"
  [ "$model" = large ] && steps="$large_steps"
  echo
  echo "model $model: ${flags[*]:-4 blocks, width 128, context 64} (batch 16, dropout 0.1)"
  for policy in none full selective; do
    : >"$work/$policy.cpp" ; : >"$work/$policy.cppdef" ; : >"$work/$policy.py"
  done
  for ((r = 1; r <= rounds; r++)); do
    for policy in none full selective; do
      out="$work/$model-$policy-$r"
      check=""
      state=""
      if [ "$r" -eq 1 ]; then
        # The C++ run writes the initial state and its losses; Python must reproduce them.
        read -r ms cpu pf < <(run_cpp "$policy" "$out" tuned "${flags[@]}" --save-initial-state "$work/$model.init.pt")
        check="$out/loss.csv"
      else
        read -r ms cpu pf < <(run_cpp "$policy" "$out" tuned "${flags[@]}")
      fi
      echo "$ms $cpu $pf" >>"$work/$policy.cpp"
      read -r ms cpu pf < <(run_py "$policy" "$work/$model.init.pt" "$check" "${flags[@]}")
      echo "$ms $cpu $pf" >>"$work/$policy.py"
      read -r ms cpu pf < <(run_cpp "$policy" "$out-default" default "${flags[@]}")
      echo "$ms $cpu $pf" >>"$work/$policy.cppdef"
    done
  done
  # Columns of the per-run records: 1 wall ms, 2 CPU ms, 3 page faults per step.
  col() { cut -d' ' -f"$2" "$work/$1" | median; }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
  per_round() { paste -d' ' "$work/$1" "$work/$2" | awk -v c="$3" '{print $c / $(c + 3)}' | median; }
  printf '%-10s | %8s %8s %8s | %8s %8s %8s | %7s %7s %7s | %9s %9s %9s %9s\n' policy "C++" "glibc" "Python" \
    "C++ CPU" "glibc" "Python" "C++ pf" "glibc" "Python" "C++/Py" "per round" "CPU C/P" "glibc/Py"
  for policy in none full selective; do
    printf '%-10s | %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %7.0f %7.0f %7.0f | %9s %9.3f %9s %9s\n' "$policy" \
      "$(col $policy.cpp 1)" "$(col $policy.cppdef 1)" "$(col $policy.py 1)" \
      "$(col $policy.cpp 2)" "$(col $policy.cppdef 2)" "$(col $policy.py 2)" \
      "$(col $policy.cpp 3)" "$(col $policy.cppdef 3)" "$(col $policy.py 3)" \
      "$(ratio "$(col $policy.cpp 1)" "$(col $policy.py 1)")" "$(per_round $policy.cpp $policy.py 1)" \
      "$(ratio "$(col $policy.cpp 2)" "$(col $policy.py 2)")" "$(ratio "$(col $policy.cppdef 1)" "$(col $policy.py 1)")"
  done
done
echo
echo "Step times in ms: wall, then process CPU time; each the mean over a run's steps without the first, median"
echo "over the rounds. pf: minor page faults per step. C++: build/examples/gpt/gpt as shipped (glibc malloc tuned);"
echo "glibc: the same with RECOMPOSE_MALLOC_TUNING=0. C++/Py: ratio of the wall medians; per round: median of the"
echo "per-round wall ratios; CPU C/P: ratio of the CPU medians; glibc/Py: C++ with glibc defaults against Python."
