#!/usr/bin/env bash
# sharded_trainer's misuse errors (meson test 'sharded-errors'): each case must exit 2 with its
# message on stderr, or, for what this build and machine can run, succeed.
#   bash errors_check.sh path/to/sharded_trainer
set -uo pipefail
exe=${1:?usage: errors_check.sh path/to/sharded_trainer}
failed=0

# expect <may-run: yes|no> <message: an extended regex> <args...>
expect() {
  local may_run=$1 message=$2 err rc
  shift 2
  err=$("$exe" --steps 1 --timeout 120 "$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -eq 0 ] && [ "$may_run" = yes ]; then
    echo "  [ok] $* runs here"
  elif [ $rc -eq 2 ] && [[ "$err" =~ $message ]]; then
    echo "  [ok] $*: $(head -n1 <<<"$err")"
  else
    echo "  [FAIL] $*: exit $rc, wanted 2 with '$message'; stderr:"
    sed 's/^/    /' <<<"$err"
    failed=1
  fi
}

expect no "--backend nccl needs --device cuda" --backend nccl
expect no "--device wants .*, got 'gpu'" --device gpu
no_cuda="--device cuda: no CUDA device here"
expect yes "$no_cuda" --device cuda --world 2
expect yes "$no_cuda|--backend nccl: this build has no NCCL" --device cuda --backend nccl --world 1
# Two ranks on one GPU: NCCL refuses it (Gloo shares the device).
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then
  expect no "$no_cuda|--backend nccl: (this build has no NCCL|one GPU per rank)" --device cuda --backend nccl --world 2
fi
exit $failed
