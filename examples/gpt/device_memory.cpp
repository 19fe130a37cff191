#include "device_memory.h"

#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif

namespace gpt {

void reset_peak_memory(const torch::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#else
  (void)device;
#endif
}

std::optional<int64_t> peak_memory(const torch::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#else
  (void)device;
#endif
  return std::nullopt;
}

void synchronize(const torch::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
#else
  (void)device;
#endif
}

}  // namespace gpt
