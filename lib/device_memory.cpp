// recompose/device_memory.h: the CUDA caching allocator's statistics (the one file of the
// library that reads them).
#include <recompose/device_memory.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace recompose {
namespace {

#ifdef RECOMPOSE_WITH_CUDA
// The caching allocator is made on CUDA's lazy initialisation; before it (a process that has not
// yet touched the device) its statistics throw "Invalid device argument : did you call init?".
// Initialising here makes the first reading 0 bytes instead of an error.
c10::DeviceIndex initialised_index(const c10::Device& device) {
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return device.has_index() ? device.index() : 0;
}

auto stats_of(const c10::Device& device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(initialised_index(device));
}

struct Allocated {
  int64_t current;
  int64_t peak;
};
Allocated allocated(const c10::Device& device) {
  const auto stats = stats_of(device);
  const auto& all =
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {all.current, all.peak};
}
#endif

}  // namespace

void reset_peak_device_memory(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(initialised_index(device));
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

int64_t device_allocation_retries(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) return stats_of(device).num_alloc_retries;
#else
  (void)device;
#endif
  return -1;
}

}  // namespace recompose
