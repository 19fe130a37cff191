#!/usr/bin/env bash
# Compiles, without a GPU, the code that only the CUDA build compiles: every translation unit that
# reads RECOMPOSE_WITH_CUDA or SHARDED_WITH_NCCL (itself or through a header of the tree), and
# sharded_trainer's nccl_backend.cpp, with the defines and include folders the CUDA build gives
# it (meson.build, examples/sharded/meson.build). Syntax only: nothing is linked, so the CUDA
# libraries libtorch_cuda needs (cuBLAS, cuDNN...) need not be here; a LibTorch with CUDA headers
# (the PyPI wheel is one) and the CUDA runtime's headers must be: a CUDA Toolkit's (CUDA_PATH,
# nvcc on PATH, /usr/local/cuda), or else those of the nvidia-cuda-runtime wheel that
# scripts/setup.sh unpacks beside the wheel's torch/ (nvidia/cu13/include), so that it runs on
# any machine scripts/test.sh runs on (CI included). A compile error found here costs no device
# time: a device call builds this code first (scripts/gpu-run.sh).
#
#   bash scripts/check-cuda-compile.sh                 # LibTorch from scripts/setup.sh
#   RECOMPOSE_TORCH_DIR=/path/to/torch CUDA_PATH=/usr/local/cuda bash scripts/check-cuda-compile.sh
#
# Exits 0 when every file compiles, 1 when one does not (its errors printed), 2 when it cannot
# check here (no CUDA headers, a CPU-only LibTorch): the line says which. RECOMPOSE_JOBS: parallel
# compilers (default: the cores).
set -euo pipefail
cd "$(dirname "$0")/.."

cannot() { echo "check-cuda-compile: cannot check here: $*" >&2; exit 2; }

torch_dir=${RECOMPOSE_TORCH_DIR:-$(bash scripts/setup.sh | tail -n1)}
[ -f "$torch_dir/include/c10/cuda/CUDAStream.h" ] ||
  cannot "$torch_dir has no CUDA headers (c10/cuda/CUDAStream.h): a CPU-only LibTorch"

# The CUDA runtime's headers: CUDA_PATH when set (and nothing else), else a toolkit, else the wheel's.
has_headers() { [ -n "$1" ] && [ -f "$1/include/cuda_runtime_api.h" ]; }
if [ -n "${CUDA_PATH:-}" ]; then
  cuda_path=$CUDA_PATH
  has_headers "$cuda_path" || cannot "no CUDA headers in CUDA_PATH='$cuda_path' (include/cuda_runtime_api.h)"
else
  cuda_path=""
  candidates=()
  command -v nvcc >/dev/null 2>&1 && candidates+=("$(dirname "$(dirname "$(command -v nvcc)")")")
  candidates+=(/usr/local/cuda "$torch_dir"/../nvidia/cu*)
  for d in "${candidates[@]}"; do
    if has_headers "$d"; then cuda_path=$d; break; fi
  done
  [ -n "$cuda_path" ] || cannot "no CUDA headers: no toolkit (CUDA_PATH, nvcc, /usr/local/cuda), none beside $torch_dir"
fi

# The runtime wheel lacks the headers cuda_runtime.h includes from crt/ (a toolkit has them): the
# nvidia-cuda-crt wheel of the runtime's major.minor (130 KB) has them, fetched once into
# $RECOMPOSE_DEPS/cuda-crt-<major.minor>.
crt_inc=""
if [ ! -f "$cuda_path/include/crt/host_config.h" ]; then
  # shellcheck source=scripts/torch-versions.sh
  source scripts/torch-versions.sh
  runtime=$(torch_cuda_runtime_wheels "${RECOMPOSE_TORCH_VERSION:-$RECOMPOSE_TORCH_DEFAULT_VERSION}" |
    tr ' ' '\n' | grep '^nvidia-cuda-runtime' || true)
  [ -n "$runtime" ] || cannot "$cuda_path/include has no crt/ and no runtime wheel is pinned for this LibTorch"
  # Its own patch releases: the runtime's major.minor, the newest patch.
  version=${runtime##*==}
  minor=${version%.*}
  crt_name=nvidia-cuda-crt${runtime#nvidia-cuda-runtime}
  crt_name=${crt_name%%==*}
  deps=${RECOMPOSE_DEPS:-$HOME/.cache/recompose}
  crt_root="$deps/cuda-crt-$minor"
  if [ ! -f "$crt_root/.complete" ]; then
    echo "check-cuda-compile: fetching $crt_name==$minor.* (crt/ headers) into $crt_root" >&2
    mkdir -p "$deps/wheels" "$crt_root"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 -d "$deps/wheels" "$crt_name==$minor.*" >&2 ||
      cannot "$crt_name==$minor.* could not be downloaded (pip download failed)"
    crt_wheel=("$deps"/wheels/"${crt_name//-/_}"-"$minor".*-*.whl)
    unzip -q -o "${crt_wheel[-1]}" 'nvidia/*' -d "$crt_root"
    touch "$crt_root/.complete"
  fi
  crt_header=("$crt_root"/nvidia/*/include/crt/host_config.h)
  crt_inc=$(dirname "$(dirname "${crt_header[0]}")")
fi

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
  -isystem "$cuda_path/include" ${crt_inc:+-isystem "$crt_inc"})

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

echo "check-cuda-compile: ${#files[@]} files, LibTorch $torch_dir, CUDA headers $cuda_path${crt_inc:+ and $crt_inc}," \
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
