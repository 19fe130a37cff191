// Peak device memory of a profiled step, from the CUDA caching allocator (what
// MemoryProfile::resident_bytes is measured with). Elsewhere there is no such figure: 0.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace recompose::detail {

// Starts a new peak measurement on `device` (nothing off CUDA).
void reset_device_peak(const c10::Device& device);
// Peak bytes allocated on `device` since the last reset; 0 off CUDA or in a build without CUDA.
int64_t device_peak_bytes(const c10::Device& device);

}  // namespace recompose::detail
