#!/usr/bin/env bash
# Installs everything recompose needs on a Debian 12 machine, idempotently:
#   - Debian packages: compiler, meson, ninja, pkg-config, cmake, doctest, range-v3, nlohmann-json
#     (the planner's JSON files), unzip, python3-pip, clang-format (the format test)
#     (pkg-config and cmake build the consumer tests, tests/consumers);
#   - LibTorch from the PyPI `torch` wheel (2.11.0 unless RECOMPOSE_TORCH_VERSION says otherwise;
#     the versions and the two small CUDA runtime wheels each one's libtorch_cpu.so links against
#     are in scripts/torch-versions.sh), unpacked OUTSIDE the checkout so every clone reuses it.
# Prints the LibTorch folder (the one holding include/ and lib/) on its last line.
#
# Environment:
#   RECOMPOSE_TORCH_VERSION  the LibTorch version to install, fetched on first use into
#                            $RECOMPOSE_DEPS/torch-<version> (default 2.11.0; one of
#                            RECOMPOSE_TORCH_VERSIONS in scripts/torch-versions.sh)
#   RECOMPOSE_DEPS           where LibTorch goes (default: $HOME/.cache/recompose)
#   RECOMPOSE_TORCH_DIR      use this existing LibTorch / torch package folder instead (skips the wheel)
set -euo pipefail
source "$(dirname "$0")/torch-versions.sh"

TORCH_VERSION=${RECOMPOSE_TORCH_VERSION:-$RECOMPOSE_TORCH_DEFAULT_VERSION}

log() { printf '[setup] %s\n' "$*" >&2; }

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_debian_packages() {
  local wanted=(g++ ninja-build meson pkg-config cmake doctest-dev librange-v3-dev nlohmann-json3-dev unzip python3-pip clang-format)
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # A pip from another Python (pyenv, venv) is as good as Debian's python3-pip.
  if [[ " ${missing[*]} " == *" python3-pip "* ]] && python3 -m pip --version >/dev/null 2>&1; then
    missing=("${missing[@]/python3-pip}")
  fi
  local real=()
  for p in "${missing[@]}"; do [ -n "$p" ] && real+=("$p"); done
  if [ ${#real[@]} -eq 0 ]; then
    log "Debian packages: all present"
    return
  fi
  log "Debian packages: installing ${real[*]}"
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${real[@]}" >&2
}

install_libtorch() {
  local cuda_runtime_wheels
  if ! cuda_runtime_wheels=$(torch_cuda_runtime_wheels "$TORCH_VERSION"); then
    echo "[setup] RECOMPOSE_TORCH_VERSION=$TORCH_VERSION is not a LibTorch version recompose supports" \
         "(supported: ${RECOMPOSE_TORCH_VERSIONS[*]}; see scripts/torch-versions.sh to add one)" >&2
    exit 2
  fi
  local deps="${RECOMPOSE_DEPS:-$HOME/.cache/recompose}"
  local root="$deps/torch-$TORCH_VERSION"
  if [ -f "$root/.complete" ]; then
    log "LibTorch $TORCH_VERSION: reusing $root/torch"
    echo "$root/torch"
    return
  fi
  log "LibTorch $TORCH_VERSION: downloading the torch wheel into $deps (500-900 MB, once per machine and version)"
  mkdir -p "$deps/wheels" "$root"
  # The wheel's C++ parts do not depend on the Python version; pin the tag so any pip works.
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
    -d "$deps/wheels" "torch==$TORCH_VERSION" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_25_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$deps/wheels" $cuda_runtime_wheels >&2
  local w spec name
  # The wheel's build tag, if any (torch-2.10.0-3-cp311-...), comes after the version.
  w=$(ls "$deps"/wheels/torch-"$TORCH_VERSION"-*.whl | head -n1)
  log "unpacking $(basename "$w")"
  unzip -q -o "$w" 'torch/include/*' 'torch/lib/*' 'torch/share/*' 'torch/version.py' -d "$root"
  # Only the pinned runtime wheels: the wheels folder may hold those of other versions.
  for spec in $cuda_runtime_wheels; do
    name=${spec%%==*}
    w=$(ls "$deps"/wheels/"${name//-/_}"-"${spec##*==}"-*.whl | head -n1)
    unzip -q -o "$w" 'nvidia/*' -d "$root"
  done
  # Python bindings are not used from C++; dropping them keeps a stray engine from loading.
  rm -f "$root/torch/lib/libtorch_python.so"
  touch "$root/.complete"
  echo "$root/torch"
}

check_tools() {
  local missing=()
  for t in meson ninja; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[setup] ${missing[*]} not found on PATH (install meson >= 1.0 and ninja)" >&2
    exit 2
  fi
  local v
  v=$(meson --version)
  if [ "$(printf '%s\n1.0.0\n' "$v" | sort -V | head -n1)" != 1.0.0 ]; then
    echo "[setup] meson $v is too old: recompose needs meson >= 1.0 (pip install 'meson>=1.0')" >&2
    exit 2
  fi
}

main() {
  install_debian_packages
  check_tools
  if [ -n "${RECOMPOSE_TORCH_DIR:-}" ]; then
    [ -d "$RECOMPOSE_TORCH_DIR/include/torch" ] || {
      echo "RECOMPOSE_TORCH_DIR=$RECOMPOSE_TORCH_DIR has no include/torch: point it at a LibTorch" \
           "folder (libtorch/ from pytorch.org) or at a Python environment's torch package." >&2
      exit 2
    }
    log "LibTorch: using RECOMPOSE_TORCH_DIR=$RECOMPOSE_TORCH_DIR"
    echo "$RECOMPOSE_TORCH_DIR"
  else
    install_libtorch
  fi
}

main "$@"
