#include "swap/copy_fence.h"

#include <atomic>
#include <chrono>

namespace recompose::detail {

namespace {

// Taken after the event is recorded. Two threads recording on one stream at once may take their
// numbers in the other order: a fence then looks later than it is, which may keep a tensor held
// longer than needed, never frees it early (Note [ Fences complete in record order ]).
uint64_t next_sequence() {
  static std::atomic<uint64_t> recorded{0};
  return recorded.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::shared_ptr<CopyFence> CopyFence::record(const c10::Stream& stream) {
  auto fence = std::make_shared<CopyFence>();
  if (uses_streams(stream.device())) {
    fence->event_.emplace(stream.device_type());
    fence->event_->record(stream);
    fence->position_.emplace(FencePosition{stream, next_sequence()});
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
