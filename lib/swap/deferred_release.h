// Device tensors swap has let go of while another stream may still read them: held here, never
// record_stream'ed, until a fence says that stream is done with them, and freed by the next
// retire(), which swap calls only where no CUDA graph capture is underway on its stream. So swap
// leaves no end-of-life event with the caching allocator for a capture to stumble on. See
// Note [ Swap copies and graph capture ].
//
// A template over the fence so that its rules are tested on CPU with a fence that completes when
// the test says and counts its queries (tests/swap_capture_test.cpp); the library uses
// DeferredRelease (CopyFence). A Fence has record(stream), done(), synchronize() and position()
// (a FencePosition, or none for a fence complete from the start).
// Not thread-safe: SwapCore calls it under its mutex.
#pragma once

#include "swap/copy_fence.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
  // Queries at most one fence that is not done per stream, and each done fence once
  // (Note [ Fences complete in record order ]): backward calls it at every unpack.
  void retire() {
    if (held_.empty()) return;
    for (Held& h : held_) fence_if_unused(h);
    probe_streams();
    std::erase_if(held_, [&](Held& h) {
      std::erase_if(h.fences, [&](const auto& fence) { return known_done(*fence); });
      return h.consumers.empty() && h.fences.empty();
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

  // Note [ Fences complete in record order ]
  // An event recorded on a stream is complete once the work queued on that stream before it is;
  // a later event on the same stream waits for all of that and more. So fences on one stream
  // complete in the order they were recorded, and once one is not done, none recorded after it on
  // that stream is done either: querying them would only ask again what is known. probe_streams()
  // queries the held fences in record order (FencePosition::sequence) and, per stream, stops at the
  // first not done; known_done() answers for every fence from that without another query: done if
  // recorded before it, so the walk must go in record order. held_ is in insertion order, not
  // record order (until_unused's fences are recorded late, when nobody else holds the tensor),
  // hence the sort. Fences found done leave h.fences, so none is queried twice.
  // A fence with no position (complete from the start: CopyFence without an event) is queried on
  // its own, which costs nothing for CopyFence.
  void probe_streams() {
    probed_.clear();
    first_not_done_.clear();
    for (const Held& h : held_) {
      for (const auto& fence : h.fences)
        if (fence->position()) probed_.push_back(fence.get());
    }
    std::ranges::sort(probed_, {}, [](const Fence* f) { return f->position()->sequence; });
    const Fence* previous = nullptr;
    for (const Fence* fence : probed_) {
      if (fence == previous) continue;  // shared by two tensors: asked once
      previous = fence;
      const FencePosition& at = *fence->position();
      if (!first_not_done(at.stream) && !fence->done()) first_not_done_.push_back(at);
    }
  }
  // The first fence probe_streams() found not done on `stream`; null when all it asked were done.
  const FencePosition* first_not_done(const c10::Stream& stream) const {
    auto it = std::ranges::find(first_not_done_, stream, &FencePosition::stream);
    return it == first_not_done_.end() ? nullptr : &*it;
  }
  // After probe_streams(): done if recorded before its stream's first fence not done.
  bool known_done(const Fence& fence) const {
    const auto& at = fence.position();
    if (!at) return fence.done();
    const FencePosition* stop = first_not_done(at->stream);
    return stop == nullptr || at->sequence < stop->sequence;
  }

  std::vector<Held> held_;
  // retire()'s scratch, kept to reuse its memory.
  std::vector<const Fence*> probed_;
  std::vector<FencePosition> first_not_done_;  // one per stream at most
};

using DeferredRelease = DeferredReleaseOf<CopyFence>;

}  // namespace recompose::detail
