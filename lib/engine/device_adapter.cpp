// Adapter: c10's device guard implementations (c10::impl::VirtualGuardImpl).
#include "engine/device_adapter.h"
#include "engine/torch_version_guard.h"

#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/engine/device_adapter.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check c10/core/impl/DeviceGuardImplInterface.h and \
VirtualGuardImpl.h (streams, device counts), then extend torch_version_guard.h"
#endif

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

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

void synchronize_stream(const c10::Stream& stream) {
  c10::impl::VirtualGuardImpl(stream.device_type()).synchronizeStream(stream);
}

c10::DeviceIndex device_count(c10::DeviceType type) {
  if (!c10::impl::hasDeviceGuardImpl(type)) return 0;
  return c10::impl::getDeviceGuardImpl(type)->deviceCount();
}

}  // namespace recompose::detail
