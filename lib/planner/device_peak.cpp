#include "device_peak.h"

#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace recompose::detail {

void reset_device_peak(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#else
  (void)device;
#endif
}

int64_t device_peak_bytes(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#else
  (void)device;
#endif
  return 0;
}

}  // namespace recompose::detail
