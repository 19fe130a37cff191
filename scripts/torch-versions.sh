# The LibTorch versions recompose is checked against, sourced by scripts/setup.sh and
# scripts/test-versions.sh; another minor version stops the build at the adapters' version guard
# with an #error naming the file to port. Adding a version: check the adapters' internals for it
# (lib/engine/torch_version_guard.h lists the files and holds the one range they share), add it
# here with its CUDA runtime wheels, then run
# `bash scripts/test-versions.sh <version>`.

# What scripts/setup.sh installs when RECOMPOSE_TORCH_VERSION is not set (and what CI builds).
RECOMPOSE_TORCH_DEFAULT_VERSION=2.11.0
RECOMPOSE_TORCH_VERSIONS=(2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)

# The two CUDA runtime wheels the PyPI torch wheel's libtorch_cpu.so links against (NEEDED
# libcudart.so.N and libcupti.so.N, found through its RPATH $ORIGIN/../../nvidia/...), pinned as
# that torch pins them: its METADATA's Requires-Dist, or, from 2.11 on, the Requires-Dist of the
# cuda-toolkit version it pins (extras cudart and cupti). Each line says the wheel's CUDA build.
torch_cuda_runtime_wheels() {
  case "$1" in
    2.10.0) echo "nvidia-cuda-runtime-cu12==12.8.90 nvidia-cuda-cupti-cu12==12.8.90" ;;  # cu128
    2.11.0 | 2.12.1 | 2.13.0 | 2.14.1)  # cu130: cuda-toolkit 13.0.2 (2.11, 2.12), 13.0.3 (2.13, 2.14)
      echo "nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85" ;;
    2.15.0) echo "nvidia-cuda-runtime==13.2.86 nvidia-cuda-cupti==13.2.86" ;;  # cu132: cuda-toolkit 13.2.2
    *) return 1 ;;
  esac
}
