#include "swap/copy_fence.h"

#include <chrono>

namespace recompose::detail {

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

double CopyFence::synchronize() const {
  if (!event_) return 0;
  const auto start = std::chrono::steady_clock::now();
  event_->synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace recompose::detail
