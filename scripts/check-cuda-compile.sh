#!/usr/bin/env bash
# Compiles, without a GPU, the code that only the CUDA build compiles: every translation unit that
# reads RECOMPOSE_WITH_CUDA or SHARDED_WITH_NCCL (itself or through a header of the tree), and
# sharded_trainer's nccl_backend.cpp, with the defines and include folders the CUDA build gives
# it (meson.build, examples/sharded/meson.build). Syntax only: nothing is linked, so the CUDA
# libraries libtorch_cuda needs (cuBLAS, cuDNN...) need not be here; a LibTorch with CUDA headers
# (the PyPI wheel is one) and a CUDA Toolkit's headers must be. A compile error found here costs
# no device time: a device call builds this code first (scripts/gpu-run.sh).
#
#   bash scripts/check-cuda-compile.sh                 # LibTorch from scripts/setup.sh
#   RECOMPOSE_TORCH_DIR=/path/to/torch CUDA_PATH=/usr/local/cuda bash scripts/check-cuda-compile.sh
#
# Exits 0 when every file compiles, 1 when one does not (its errors printed), 2 when it cannot
# check here (no toolkit, a CPU-only LibTorch): the line says which. RECOMPOSE_JOBS: parallel
# compilers (default: the cores).
set -euo pipefail
cd "$(dirname "$0")/.."

cannot() { echo "check-cuda-compile: cannot check here: $*" >&2; exit 2; }

torch_dir=${RECOMPOSE_TORCH_DIR:-$(bash scripts/setup.sh | tail -n1)}
[ -f "$torch_dir/include/c10/cuda/CUDAStream.h" ] ||
  cannot "$torch_dir has no CUDA headers (c10/cuda/CUDAStream.h): a CPU-only LibTorch"

cuda_path=${CUDA_PATH:-}
if [ -z "$cuda_path" ] && command -v nvcc >/dev/null 2>&1; then
  cuda_path=$(dirname "$(dirname "$(command -v nvcc)")")
fi
cuda_path=${cuda_path:-/usr/local/cuda}
[ -f "$cuda_path/include/cuda_runtime_api.h" ] ||
  cannot "no CUDA Toolkit headers in '$cuda_path' (set CUDA_PATH)"

# nccl.h where examples/sharded/meson.build looks for it, in its order.
nccl_inc=""
for d in "$torch_dir/../nvidia/nccl/include" "$torch_dir/../nvidia/cu13/include" \
  "$torch_dir/../nvidia/cu12/include" "$cuda_path/include" /usr/local/include /usr/include; do
  if [ -f "$d/nccl.h" ]; then nccl_inc=$d; break; fi
done

# The files: those that read the macros, those that include a header that does, and the
# CUDA-only sources.
mapfile -t readers < <(git grep -l -e RECOMPOSE_WITH_CUDA -e SHARDED_WITH_NCCL -- '*.cpp' '*.h')
files=()
for f in "${readers[@]}"; do
  case "$f" in
    *.cpp) files+=("$f") ;;
    *.h)  # includers name the header by its folder and file (../common/device.h, "device.h" beside it)
      while IFS= read -r g; do files+=("$g"); done < <(
        git grep -l -e "[\"/]$(basename "$(dirname "$f")")/$(basename "$f")\"" -- '*.cpp'
        git grep -l -e "\"$(basename "$f")\"" -- "$(dirname "$f")/*.cpp") ;;
  esac
done
files+=(examples/sharded/nccl_backend.cpp)
mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)

common=(-fsyntax-only -std=c++20 -Wall -Wextra -Wno-subobject-linkage -pthread
  -D_GLIBCXX_USE_CXX11_ABI=1 -DRECOMPOSE_WITH_CUDA=1 -Iinclude
  -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$torch_dir/include"
  -isystem "$cuda_path/include")

# One file's flags, into the array `extra`: its target's include folders and defines.
flags_of() {
  local f=$1 folder
  folder=$(dirname "$f")
  case "$f" in
    lib/*) extra=(-Ilib) ;;
    hooks/*) extra=(-Ihooks) ;;
    tests/*) extra=(-Itests -Ilib "-DRECOMPOSE_SOURCE_DIR=\"$PWD\"") ;;
    examples/sharded/*)
      extra=("-I$folder" -DUSE_C10D_GLOO=1 -isystem "$folder/gloo_shim")
      [ -z "$nccl_inc" ] || extra+=(-DUSE_C10D_NCCL=1 -DSHARDED_WITH_NCCL=1 -isystem "$nccl_inc") ;;
    examples/gpt/*) extra=("-I$folder" "-DRECOMPOSE_GPT_DATA=\"$PWD/examples/gpt/data/alice.txt\"") ;;
    *) extra=("-I$folder") ;;
  esac
}

echo "check-cuda-compile: ${#files[@]} files, LibTorch $torch_dir, CUDA Toolkit $cuda_path," \
  "nccl.h ${nccl_inc:-not found: examples/sharded/nccl_backend.cpp and SHARDED_WITH_NCCL left out}"
[ -n "$nccl_inc" ] || mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -v -x examples/sharded/nccl_backend.cpp)

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# One line per file, each word quoted, run by as many shells as there are jobs.
extra=()
for f in "${files[@]}"; do
  flags_of "$f"
  log="$logs/$(tr / _ <<<"$f").log"
  # shellcheck disable=SC2016  # the inner sh expands them
  printf '%q ' sh -c 'if c++ "$@" >"$0" 2>&1; then echo "ok      $1"; else echo "FAILED  $1"; fi' \
    "$log" "$f" "${common[@]}" "${extra[@]}"
  printf '\n'
done >"$logs/commands"
results=$(xargs -d '\n' -P "${RECOMPOSE_JOBS:-$(nproc)}" -I{} bash -c '{}' <"$logs/commands" | sort -k2)
echo "$results"
status=0
if grep -q '^FAILED' <<<"$results"; then
  status=1
  for log in "$logs"/*.log; do
    [ -s "$log" ] && { echo "--- ${log##*/}"; grep -E 'error' "$log" | head -n 20; }
  done
fi
echo "check-cuda-compile: $(grep -c '^ok' <<<"$results" || true) of ${#files[@]} files compile with CUDA on"
exit $status
