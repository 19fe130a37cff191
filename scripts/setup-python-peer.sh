#!/usr/bin/env bash
# Installs PyTorch 2.11.0 for Python in a virtual environment OUTSIDE the checkout, for the
# Python peer of the GPT example (examples/gpt/python): the same libtorch_cpu.so the C++ side
# links (scripts/setup.sh unpacks the same PyPI wheel), driven from Python. Idempotent: a
# complete environment is reused. Prints the environment's python on its last line.
#
# The Linux wheel's libtorch_cuda.so is loaded by `import torch` even on a CPU-only machine, so
# its CUDA libraries (cuBLAS, cuDNN, NCCL, ... about 3 GB from PyPI) are installed too; nothing
# of them runs on CPU.
#
# With RECOMPOSE_PY_PEER_LEAN=1 it installs instead the torch wheel without its dependencies, the
# small pure-Python ones, and only the five CUDA libraries that `import torch` cannot load without
# (cudart and cupti, which scripts/setup.sh has cached, cuFile, cuSPARSELt, NVSHMEM): about 1.7 GB
# in all, no Triton (torch.compile's CUDA path is not for a CPU machine; gpt_peer.py says so).
#
# Environment:
#   RECOMPOSE_DEPS     cache folder (default: $HOME/.cache/recompose); the torch wheel that
#                      scripts/setup.sh downloaded there (wheels/) is reused
#   RECOMPOSE_PY_PEER  the virtual environment (default: $RECOMPOSE_DEPS/py-torch-2.11)
#   RECOMPOSE_PY_PEER_LEAN  1: the lean install above (default 0)
set -euo pipefail

TORCH_VERSION=2.11.0
deps="${RECOMPOSE_DEPS:-$HOME/.cache/recompose}"
venv="${RECOMPOSE_PY_PEER:-$deps/py-torch-2.11}"
log() { printf '[setup-python-peer] %s\n' "$*" >&2; }

if [ -f "$venv/.complete" ] && "$venv/bin/python" -c "import torch" 2>/dev/null; then
  log "reusing $venv (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
  echo "$venv/bin/python"
  exit 0
fi

# The wheel is built for one CPython; the cached LibTorch wheel is cp311.
python=python3
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    python="$candidate"
    break
  fi
done
log "creating $venv with $("$python" --version)"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
mkdir -p "$deps/wheels"
# --find-links: the torch wheel already in the cache is not downloaded again. numpy: as users
# have it (torch warns at import without it).
if [ "${RECOMPOSE_PY_PEER_LEAN:-0}" = 1 ]; then
  # The versions torch 2.11.0's metadata pins (cuFile: cuda-toolkit 13.0.2's), its Python
  # dependencies as it states them.
  log "installing torch==$TORCH_VERSION without its dependencies, then the few import needs (lean)"
  "$venv/bin/python" -m pip install --quiet --no-deps --find-links "$deps/wheels" "torch==$TORCH_VERSION" \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85 nvidia-cufile==1.15.1.6 \
    nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 >&2
  "$venv/bin/python" -m pip install --quiet filelock "typing-extensions>=4.10.0" "setuptools<82" \
    "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy >&2
else
  log "installing torch==$TORCH_VERSION and its dependencies from PyPI (several GB, once per machine)"
  "$venv/bin/python" -m pip install --quiet --find-links "$deps/wheels" "torch==$TORCH_VERSION" numpy >&2
fi
"$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__" >&2
touch "$venv/.complete"
log "torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in $venv"
echo "$venv/bin/python"
