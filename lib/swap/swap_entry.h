// The state of one offloaded tensor. Its handle, the public SwappedTensor, owns it; the tables of
// its SwapCore (groups, aliases, copies in flight) point at it and never own a handle.
// See Note [ Swap lifetimes ].
#pragma once

#include "events/events.h"
#include "swap/copy_fence.h"

#include <recompose/swap.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace recompose::detail {

struct SwapEntry {
  explicit SwapEntry(const at::Tensor& source)
      : device(source.device()), nbytes(static_cast<int64_t>(source.nbytes())) {}

  const c10::Device device;
  const int64_t nbytes;
  // Set once, under the core's lock, before the handle is handed out.
  int64_t group = -1;
  std::weak_ptr<SwappedTensor> handle;  // for a second save of the same tensor to share it
  // Guarded by the core's mutex from here on.
  SwapState state = SwapState::Released;  // Offloading once its copy to host is launched
  at::Tensor device_copy;                 // the source, until its copy to host has landed
  at::Tensor host_buffer;                 // 1-D pool buffer
  at::Tensor host_view;                   // host_buffer with the source's sizes and strides
  at::Tensor reloaded;                    // the reloaded device tensor until every user has it
  std::vector<c10::Stream> consumers;     // the streams `reloaded` was handed to (get)
  std::shared_ptr<CopyFence> fence;       // the last copy (offload or reload)
  bool keep_on_device = false;            // prefetched while offloading: keep device_copy
  bool pinned = false;
  const c10::StorageImpl* storage_key = nullptr;  // the source's storage (SwapAliases)
  int64_t users = 0;              // holders that share this offload (one per offload() call)
  int64_t gets_since_reload = 0;  // users served from the current device copy
  int64_t generation = 0;         // reloads launched so far
  // The events' tag of the region that saved it (null when no sink listened): its copies are
  // reported with it. The last copy's launch, and whether its landing was reported.
  events::Tag region;
  std::chrono::steady_clock::time_point copy_launched;
  bool landing_reported = true;
};

}  // namespace recompose::detail
