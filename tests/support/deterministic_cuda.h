// Deterministic CUDA kernels for the span of a test, so that gradients compare bitwise.
#pragma once

#include <ATen/Context.h>

#include <cstdlib>

namespace rt {

// cuBLAS is deterministic only with a fixed workspace configuration, which must be in the
// environment before its first handle is made; with it set, deterministic algorithms do not
// reject matrix products. Restores the previous setting on exit.
class DeterministicCuda {
 public:
  DeterministicCuda()
      : was_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicCuda() { at::globalContext().setDeterministicAlgorithms(was_, warn_only_); }
  DeterministicCuda(const DeterministicCuda&) = delete;
  DeterministicCuda& operator=(const DeterministicCuda&) = delete;

 private:
  bool was_, warn_only_;
};

}  // namespace rt
