// Device-generic stream and event helpers for swap copies (c10 only, no CUDA headers).
//
// CPU has no streams and no events (its guard impl throws on events): there every copy is
// synchronous and every fence is complete, so the same swap code runs on CPU and device.
#pragma once

#include "engine/device_adapter.h"

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace recompose::detail {

// uses_streams, current_stream, side_stream: engine/device_adapter.h.

// Where a fence's event stands among the events recorded on its stream: events on one stream
// complete in the order they were recorded (Note [ Fences complete in record order ],
// swap/deferred_release.h).
struct FencePosition {
  c10::Stream stream;
  uint64_t sequence;  // the record order, one count across all streams
};

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
  // Set when an event was recorded; none for a fence complete from the start.
  const std::optional<FencePosition>& position() const { return position_; }

 private:
  std::optional<c10::Event> event_;
  std::optional<FencePosition> position_;
};

}  // namespace recompose::detail
