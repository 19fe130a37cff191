// Device tensors swap has let go of while another stream may still read them: held here, never
// record_stream'ed, until a fence says that stream is done with them, and freed by the next
// retire(), which swap calls only where no CUDA graph capture is underway on its stream. So swap
// leaves no end-of-life event with the caching allocator for a capture to stumble on. See
// Note [ Swap copies and graph capture ].
//
// A template over the fence so that its rules are tested on CPU with a fence that completes when
// the test says (tests/swap_capture_test.cpp); the library uses DeferredRelease (CopyFence).
// Not thread-safe: SwapCore calls it under its mutex.
#pragma once

#include "swap/copy_fence.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace recompose::detail {

template <class Fence>
class DeferredReleaseOf {
 public:
  // `tensor` is read by the work behind `fence` (an offload's copy still in flight): held until
  // the fence is complete.
  void until_complete(at::Tensor tensor, std::shared_ptr<const Fence> fence) {
    held_.push_back(Held{std::move(tensor), {}, {std::move(fence)}});
  }
  // `tensor` was handed to the `consumers` streams (a reload): held until nobody else holds it or
  // its storage, then until the work those streams had queued at that moment is complete.
  void until_unused(at::Tensor tensor, std::vector<c10::Stream> consumers) {
    held_.push_back(Held{std::move(tensor), std::move(consumers), {}});
  }
  // Frees what is safe to free; records the consumers' fences of tensors that nobody else holds
  // any more. Queries and records events: never while the caller's stream is being captured.
  void retire() {
    std::erase_if(held_, [](Held& h) {
      fence_if_unused(h);
      return h.consumers.empty() &&
             std::ranges::all_of(h.fences, [](const auto& fence) { return fence->done(); });
    });
  }
  // retire(), after waiting on the host for the fences of every tensor nobody else holds. Returns
  // the seconds waited.
  double drain() {
    double waited = 0;
    for (Held& h : held_) {
      fence_if_unused(h);
      if (h.consumers.empty()) {
        for (const auto& fence : h.fences) waited += fence->synchronize();
      }
    }
    retire();
    return waited;
  }
  std::size_t size() const { return held_.size(); }

 private:
  struct Held {
    at::Tensor tensor;
    std::vector<c10::Stream> consumers;  // fences not recorded yet: someone else holds it
    std::vector<std::shared_ptr<const Fence>> fences;
  };
  // Nobody but this queue holds the tensor or its storage: no new work can read it, so the work
  // its consumers have queued by now is the last that does.
  static void fence_if_unused(Held& h) {
    if (h.consumers.empty() || h.tensor.use_count() != 1 || h.tensor.storage().use_count() != 1)
      return;
    for (const auto& stream : h.consumers) h.fences.push_back(Fence::record(stream));
    h.consumers.clear();
  }

  std::vector<Held> held_;
};

using DeferredRelease = DeferredReleaseOf<CopyFence>;

}  // namespace recompose::detail
