// memory/memory_in_use.h: the CUDA caching allocator's statistics and the CPU counting wrapper's.
#include "memory/memory_in_use.h"

#include "memory/cpu_memory_counter.h"

#include <recompose/cpu_memory_counting.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace recompose::detail {
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
#endif

bool counted_cpu(const c10::Device& device) { return device.is_cpu() && cpu_memory_counting(); }

}  // namespace

MemoryReading read_memory(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = stats_of(device);
    constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto& all = stats.allocated_bytes[kAll];
    const auto& reserved = stats.reserved_bytes[kAll];
    return {all.current, all.peak, reserved.current, reserved.peak};
  }
#endif
  if (counted_cpu(device)) return {counted_cpu_current(), counted_cpu_peak()};
  return {};
}

void reset_memory_peak(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(initialised_index(device));
#endif
  if (counted_cpu(device)) reset_cpu_peak();
}

const char* memory_source(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) return "CUDA caching allocator";
#endif
  return counted_cpu(device) ? "CPU counting allocator" : "";
}

void release_cached_memory(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    (void)initialised_index(device);
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#else
  (void)device;
#endif
}

int64_t memory_allocation_retries(const c10::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) return stats_of(device).num_alloc_retries;
#else
  (void)device;
#endif
  return -1;
}

}  // namespace recompose::detail
