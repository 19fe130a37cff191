// --device for the benchmarks, synchronization and peak device memory. CUDA parts compile only
// in a CUDA build (-Dcuda=enabled, or auto with a GPU): RECOMPOSE_WITH_CUDA.
#pragma once

#include <recompose/device_memory.h>
#include <torch/types.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <torch/cuda.h>
#endif

#include <cstdint>
#include <stdexcept>
#include <string>

namespace examples {

// auto: CUDA when this build has it and a GPU is visible, else CPU. Throws std::invalid_argument
// for an unknown name and std::runtime_error for cuda where there is none.
inline torch::Device pick_device(const std::string& requested) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda") {
    throw std::invalid_argument("--device must be auto, cpu or cuda, got '" + requested + "'");
  }
  bool cuda = false;
#ifdef RECOMPOSE_WITH_CUDA
  cuda = torch::cuda::is_available();
#endif
  if (requested == "cuda" && !cuda) {
    throw std::runtime_error(
        "--device cuda, but this build has no CUDA (configure with -Dcuda=enabled) or no GPU is "
        "visible");
  }
  return (requested == "cuda" || (requested == "auto" && cuda)) ? torch::Device(torch::kCUDA, 0)
                                                                : torch::Device(torch::kCPU);
}

inline void synchronize(const torch::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
#else
  (void)device;
#endif
}

// Peak device memory: recompose::reset_peak_device_memory / peak_device_memory
// (recompose/device_memory.h; -1 on CPU, not measured).
using recompose::peak_device_memory;
using recompose::reset_peak_device_memory;

// An integer flag value, with the flag's name in the error.
inline int64_t int_flag(const std::string& name, const std::string& value) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(name + " needs an integer, got '" + value + "'");
}

}  // namespace examples
