// recompose/device_memory.h: the CUDA caching allocator's statistics (the one file of the
// library that reads them).
#include <recompose/device_memory.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace recompose {
namespace {

#ifdef RECOMPOSE_WITH_CUDA
struct Allocated {
  int64_t current;
  int64_t peak;
};
Allocated allocated(const c10::Device& device) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
  const auto& all =
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {all.current, all.peak};
}
#endif

}  // namespace

void reset_peak_device_memory(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#else
  (void)device;
#endif
}

int64_t peak_device_memory(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) return allocated(device).peak;
#else
  (void)device;
#endif
  return -1;
}

int64_t current_device_memory(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) return allocated(device).current;
#else
  (void)device;
#endif
  return -1;
}

}  // namespace recompose
