#include "device_memory.h"

#include <recompose/device_memory.h>

#ifdef RECOMPOSE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#endif

#include <algorithm>

namespace gpt {

// recompose's readers answer -1 where a device is not measured (CPU without counting): 0 here.
void reset_peak_memory(const torch::Device& device) { recompose::reset_peak_device_memory(device); }

int64_t peak_memory(const torch::Device& device) {
  return std::max<int64_t>(0, recompose::peak_device_memory(device));
}

int64_t current_memory(const torch::Device& device) {
  return std::max<int64_t>(0, recompose::current_device_memory(device));
}

bool cap_device_memory(const torch::Device& device, double fraction) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) {
    // The cap counts what the allocator reserved, its cached free blocks included: what the
    // process cached before (a profile taken uncapped) goes back to the device first. The
    // allocator exists only after CUDA's lazy initialisation (a cap set before the first
    // allocation would throw "did you call init?").
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       device.has_index() ? device.index() : 0);
    return true;
  }
#endif
  (void)device;
  (void)fraction;
  return false;
}

void synchronize(const torch::Device& device) {
#ifdef RECOMPOSE_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
#else
  (void)device;
#endif
}

}  // namespace gpt
