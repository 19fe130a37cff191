// Device-generic stream and event helpers for swap copies (c10 only, no CUDA headers).
//
// CPU has no streams and no events (its guard impl throws on events): there every copy is
// synchronous and every fence is complete, so the same swap code runs on CPU and device.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>

namespace recompose::detail {

// Whether copies from/to `device` are asynchronous on streams (accelerators) or synchronous.
bool uses_streams(const c10::Device& device);

// The current stream of `device` on the calling thread (autograd device threads set theirs).
c10::Stream current_stream(const c10::Device& device);

// A stream for copies, distinct from the current one where the backend has a pool; the current
// stream otherwise (copies then serialise with compute, still correctly ordered).
c10::Stream side_stream(const c10::Device& device);

// The completion of the work queued on a stream up to some point.
class CopyFence {
 public:
  // Complete from the start (synchronous copies).
  CopyFence() = default;
  // Records an event on `stream`; a complete fence for streamless devices.
  static std::shared_ptr<CopyFence> record(const c10::Stream& stream);

  bool done() const;
  // Makes `stream` wait for the fence (on the device; the host does not wait).
  void block(const c10::Stream& stream) const;
  // Waits on the host.
  void synchronize() const;

 private:
  std::optional<c10::Event> event_;
};

}  // namespace recompose::detail
