// Device-generic streams and device counts (c10's device guard implementations), for the RNG
// stash and for swap's copies. Implemented in device_adapter.cpp, the only file that includes
// LibTorch's device-guard internals. No CUDA headers: the same code runs on every backend.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Stream.h>

namespace recompose::detail {

// Whether copies from/to `device` are asynchronous on streams (accelerators) or synchronous.
bool uses_streams(const c10::Device& device);

// The current stream of `device` on the calling thread (autograd device threads set theirs).
c10::Stream current_stream(const c10::Device& device);

// A stream for copies, distinct from the current one where the backend has a pool; the current
// stream otherwise (copies then serialise with compute, still correctly ordered).
c10::Stream side_stream(const c10::Device& device);

// Waits until every op queued on `stream` has run.
void synchronize_stream(const c10::Stream& stream);

// The number of devices of `type` (0 when the backend has none).
c10::DeviceIndex device_count(c10::DeviceType type);

}  // namespace recompose::detail
