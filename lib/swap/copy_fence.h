// Device-generic stream and event helpers for swap copies (c10 only, no CUDA headers).
//
// CPU has no streams and no events (its guard impl throws on events): there every copy is
// synchronous and every fence is complete, so the same swap code runs on CPU and device.
#pragma once

#include "engine/device_adapter.h"

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>

namespace recompose::detail {

// uses_streams, current_stream, side_stream: engine/device_adapter.h.

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
  // Waits on the host; returns the seconds waited.
  double synchronize() const;

 private:
  std::optional<c10::Event> event_;
};

}  // namespace recompose::detail
