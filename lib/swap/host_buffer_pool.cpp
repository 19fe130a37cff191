#include "swap/host_buffer_pool.h"

#include <ATen/ops/empty.h>

namespace recompose::detail {

HostBufferPool::Acquired HostBufferPool::acquire(const c10::Device& source, c10::ScalarType dtype,
                                                 int64_t numel, bool pinned) {
  std::unique_lock lock(mutex_);
  auto it = idle_.find(Key{source.type(), source.index(), dtype, numel, pinned});
  if (it != idle_.end()) {
    auto& list = it->second;
    // Buffers still being read by a reload are skipped rather than waited for.
    for (auto idle = list.begin(); idle != list.end(); ++idle) {
      if (idle->last_use && !idle->last_use->done()) continue;
      at::Tensor buffer = std::move(idle->buffer);
      idle_bytes_ -= static_cast<int64_t>(buffer.nbytes());
      list.erase(idle);
      if (list.empty()) idle_.erase(it);
      return {std::move(buffer), true};
    }
  }
  lock.unlock();  // a new (pinned) allocation may take long: other threads need not wait for it
  auto options = at::TensorOptions().dtype(dtype).device(c10::kCPU).pinned_memory(pinned);
  return {at::empty({numel}, options), false};
}

void HostBufferPool::release(const c10::Device& source, at::Tensor buffer, bool pinned,
                             std::shared_ptr<CopyFence> last_use, int64_t max_bytes) {
  const auto bytes = static_cast<int64_t>(buffer.nbytes());
  std::lock_guard lock(mutex_);
  if (max_bytes >= 0 && idle_bytes_ + bytes > max_bytes) {
    // Freed, not pooled. A pinned buffer freed while a copy reads it is safe: the caching host
    // allocator recorded the copy's stream and waits for it before reuse.
    return;
  }
  idle_[Key{source.type(), source.index(), buffer.scalar_type(), buffer.numel(), pinned}].push_back(
      Idle{std::move(buffer), std::move(last_use)});
  idle_bytes_ += bytes;
}

int64_t HostBufferPool::idle_bytes() const {
  std::lock_guard lock(mutex_);
  return idle_bytes_;
}

void HostBufferPool::clear() {
  std::lock_guard lock(mutex_);
  idle_.clear();
  idle_bytes_ = 0;
}

}  // namespace recompose::detail
