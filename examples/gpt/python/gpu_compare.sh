#!/usr/bin/env bash
# The GPT example (C++, recompose) against the same model trained by PyTorch in Python
# (gpt_peer.py) on one CUDA GPU, per checkpointing policy, runs alternating C++ / Python.
#
#   bash examples/gpt/python/gpu_compare.sh [--rounds 2] [--steps 12] [--budget 50%]
#       [--model "--layers 12 --width 1024 --heads 16 --context 1024 --batch 8"]
#
# Every run is a fresh process with --device cuda --bf16 (CUDA autocast to bfloat16). Per run:
# the mean step time without the first step, and the step's peak CUDA memory above the weights
# and optimizer state (the largest over the steps without the first), both sides measured alike.
# Prints, per policy, the medians over the rounds, the ratios against "none" of the same side, and
# C++ / Python. Pairs: none-none, full-full (torch.utils.checkpoint) and composable,
# selective-selective and every-second-mm (the same save lists), offload (recompose::apply_offload)
# beside save_on_cpu and torchtune's OffloadActivations (when importable); swap (MUST_SWAP on
# matrix products) and the planner (--budget) have no Python peer.
#
# Needs build-gpu/examples/gpt/gpt (or RECOMPOSE_GPT) and a Python with CUDA torch
# (RECOMPOSE_PYTHON, default /opt/torch/.venv/bin/python).
set -euo pipefail

root="$(cd "$(dirname "$0")/../../.." && pwd)"
gpt="${RECOMPOSE_GPT:-$root/build-gpu/examples/gpt/gpt}"
peer="$root/examples/gpt/python/gpt_peer.py"
python="${RECOMPOSE_PYTHON:-/opt/torch/.venv/bin/python}"
rounds=2
steps=12
budget="50%"
model="--layers 12 --width 1024 --heads 16 --context 1024 --batch 8"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--steps N] [--budget B] [--model FLAGS]" >&2; exit 2 ;;
  esac
done
[ -x "$gpt" ] || { echo "no $gpt: build it first" >&2; exit 1; }
[ -x "$python" ] || { echo "no Python at $python (set RECOMPOSE_PYTHON)" >&2; exit 1; }
read -r -a model_flags <<<"$model"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# C++ policies, each with its Python peers (- for none).
cpp_policies=(none full selective every-second-mm offload swap planned)
declare -A peers=([none]="none" [full]="full composable" [selective]="selective" [every-second-mm]="every-second-mm"
                  [offload]="save-on-cpu torchtune-offload" [swap]="-" [planned]="-")

if "$python" -c 'import torchtune.training' >/dev/null 2>&1; then have_torchtune=1; else have_torchtune=0; fi

# One C++ run; prints "<mean step ms> <step peak MiB>" from its loss.csv.
run_cpp() {  # policy out
  local policy="$1" out="$2" flags=(--policy "$1")
  [ "$policy" = planned ] && flags=(--budget "$budget")
  "$gpt" "${flags[@]}" --device cuda --bf16 --steps "$steps" --sample 0 --out "$out" "${model_flags[@]}" \
    >"$out.log" 2>&1 || { echo "C++ $policy failed:" >&2; tail -20 "$out.log" >&2; echo "nan nan"; return; }
  awk -F, 'NR > 1 && $2 > 1 {n++; ms += $4; if ($6 > peak) peak = $6} END {printf "%.3f %.1f\n", ms / n, peak / 1048576}' \
    "$out/loss.csv"
}

# One Python run; prints "<mean step ms> <step peak MiB>".
run_py() {  # policy
  "$python" "$peer" --quiet --policy "$1" --device cuda --bf16 --steps "$steps" --threads 0 "${model_flags[@]}" \
    >"$work/py.log" 2>&1 || { echo "Python $1 failed:" >&2; tail -5 "$work/py.log" >&2; echo "nan nan"; return; }
  sed -n 's/.*mean step \([0-9.]*\) ms .*step peak \([0-9.]*\) MiB.*/\1 \2/p' "$work/py.log"
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
col() { cut -d' ' -f"$2" "$work/$1" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b + 0 == 0 || a == "nan" || b == "nan") print "-"; else printf "%.3f", a / b}'; }

echo "GPT on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1): ${model}, bf16 autocast, dropout 0.1,"
echo "$steps steps per run, $rounds alternating rounds; C++: $gpt; Python: $("$python" -c 'import sys, torch; print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")')"
[ $have_torchtune -eq 1 ] || echo "torchtune is not importable here: no torchtune-offload runs"
for ((r = 1; r <= rounds; r++)); do
  for policy in "${cpp_policies[@]}"; do
    run_cpp "$policy" "$work/cpp-$policy-$r" >>"$work/cpp-$policy"
    for py in ${peers[$policy]}; do
      [ "$py" = - ] && continue
      [ "$py" = torchtune-offload ] && [ $have_torchtune -eq 0 ] && continue
      run_py "$py" >>"$work/py-$py"
    done
  done
  echo "round $r done" >&2
done

none_ms=$(col cpp-none 1); none_peak=$(col cpp-none 2)
py_none_ms=$(col py-none 1); py_none_peak=$(col py-none 2)
echo
printf '%-16s %9s %10s %7s %7s | %-18s %9s %10s %7s %7s | %8s %8s\n' "C++ policy" "step ms" "peak MiB" "time x" "peak x" \
  "Python peer" "step ms" "peak MiB" "time x" "peak x" "C++/Py t" "C++/Py m"
for policy in "${cpp_policies[@]}"; do
  ms=$(col "cpp-$policy" 1); peak=$(col "cpp-$policy" 2)
  first=1
  for py in ${peers[$policy]}; do
    if [ "$py" = - ] || [ ! -s "$work/py-$py" ]; then
      pms=nan; ppeak=nan; [ "$py" = - ] && py="(no peer)"
      [ "$py" = torchtune-offload ] && py="(no torchtune)"
    else
      pms=$(col "py-$py" 1); ppeak=$(col "py-$py" 2)
    fi
    if [ $first -eq 1 ]; then
      printf '%-16s %9.2f %10.1f %7s %7s | ' "$policy" "$ms" "$peak" "$(ratio "$ms" "$none_ms")" "$(ratio "$peak" "$none_peak")"
    else
      printf '%-16s %9s %10s %7s %7s | ' "" "" "" "" ""
    fi
    printf '%-18s %9s %10s %7s %7s | %8s %8s\n' "$py" "$pms" "$ppeak" "$(ratio "$pms" "$py_none_ms")" \
      "$(ratio "$ppeak" "$py_none_peak")" "$(ratio "$ms" "$pms")" "$(ratio "$peak" "$ppeak")"
    first=0
  done
done
echo
echo "step ms: mean over a run's steps without the first, median over the rounds. peak MiB: the step's peak CUDA"
echo "memory above weights and optimizer state (caching allocator: max allocated minus allocated at rest)."
echo "time x / peak x: against none of the same side. C++/Py: recompose's policy against its Python peer."
echo "planned: recompose's planner at --budget $budget (profile and solve before the first step)."
