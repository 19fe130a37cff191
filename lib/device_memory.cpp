// recompose/device_memory.h: the readers of memory/memory_in_use.h (the CUDA caching allocator's
// statistics; CPU's counts while recompose::CpuMemoryCounting is on).
#include <recompose/device_memory.h>

#include "memory/memory_in_use.h"

namespace recompose {

void reset_peak_device_memory(const c10::Device& device) { detail::reset_memory_peak(device); }

int64_t peak_device_memory(const c10::Device& device) { return detail::read_memory(device).peak; }

int64_t peak_reserved_device_memory(const c10::Device& device) {
  return detail::read_memory(device).reserved_peak;
}

int64_t current_device_memory(const c10::Device& device) {
  return detail::read_memory(device).current;
}

int64_t device_allocation_retries(const c10::Device& device) {
  return detail::memory_allocation_retries(device);
}

}  // namespace recompose
