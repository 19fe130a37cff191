#include "swap/copy_fence.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace recompose::detail {

bool uses_streams(const c10::Device& device) {
  const auto type = device.type();
  if (type == c10::DeviceType::CPU || type == c10::DeviceType::Meta) return false;
  return c10::impl::hasDeviceGuardImpl(type);
}

c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

c10::Stream side_stream(const c10::Device& device) {
  const c10::impl::VirtualGuardImpl impl(device.type());
  try {
    return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  } catch (const c10::Error&) {
    // Backends without a stream pool: copies share the current stream.
    return impl.getStream(device);
  }
}

std::shared_ptr<CopyFence> CopyFence::record(const c10::Stream& stream) {
  auto fence = std::make_shared<CopyFence>();
  if (uses_streams(stream.device())) {
    fence->event_.emplace(stream.device_type());
    fence->event_->record(stream);
  }
  return fence;
}

bool CopyFence::done() const { return !event_ || event_->query(); }

void CopyFence::block(const c10::Stream& stream) const {
  if (event_) event_->block(stream);
}

void CopyFence::synchronize() const {
  if (event_) event_->synchronize();
}

}  // namespace recompose::detail
