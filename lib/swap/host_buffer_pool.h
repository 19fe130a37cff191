// Host buffers for offloaded tensors, kept across steps: pinned allocations are slow (they
// map pages and may synchronise the device), and a training step offloads the same shapes
// every time. Thread-safe; its mutex is a leaf (nothing is called while it is held).
#pragma once

#include "swap/copy_fence.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace recompose::detail {

class HostBufferPool {
 public:
  struct Acquired {
    at::Tensor buffer;  // 1-D, `numel` elements of `dtype`, on the CPU
    bool hit;
  };

  // A buffer for a tensor of `numel` elements of `dtype` coming from `source`: from the pool if
  // an idle one exists whose last copy has finished, else newly allocated (pinned if `pinned`).
  Acquired acquire(const c10::Device& source, c10::ScalarType dtype, int64_t numel, bool pinned);
  // Gives a buffer back; `last_use` is the fence of the last copy that touches it. Frees it
  // instead if the pool would exceed `max_bytes` (-1: no limit).
  void release(const c10::Device& source, at::Tensor buffer, bool pinned,
               std::shared_ptr<CopyFence> last_use, int64_t max_bytes);

  int64_t idle_bytes() const;
  void clear();

 private:
  // The source device is part of the key: a buffer is only reused on the copy stream of the
  // device it was last copied on; pinnedness follows from the device.
  using Key = std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType, int64_t, bool>;
  struct Idle {
    at::Tensor buffer;
    std::shared_ptr<CopyFence> last_use;
  };
  mutable std::mutex mutex_;
  std::map<Key, std::vector<Idle>> idle_;
  int64_t idle_bytes_ = 0;
};

}  // namespace recompose::detail
