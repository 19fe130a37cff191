// SwapCore's way back (swap_core.h): reloads of a group and the groups before it, a saved
// tensor handed to backward (get), the reloaded device copy let go of once every user has it, and
// prefetches. The offload side, polling and release are in swap_core.cpp.
#include "swap/swap_core.h"

#include "engine/internal_ops.h"
#include "swap/entry_events.h"
#include "swap/stream_capture.h"
#include "swap/swap_access.h"

#include <recompose/checkpoint_error.h>

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <utility>

namespace recompose::detail {

void SwapCore::launch_reload_locked(SwapEntry& e, events::CopyCause cause) {
  copy_begins(e, events::CopyDirection::ToDevice);
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions().dtype(e.host_view.scalar_type()).device(e.device);
  copy_launching(e);
  auto copy = copies_.launch(
      e.device, e.pinned, /*after_current_work=*/false, [&](bool non_blocking, const c10::Stream*) {
        // Allocated on the copy stream; get() hands it to the stream that consumes it, and
        // let_reloaded_go_locked holds it until that stream is done with it.
        e.reloaded = at::empty_strided(e.host_view.sizes(), e.host_view.strides(), options);
        e.reloaded.copy_(e.host_view, non_blocking);
      });
  e.fence = std::move(copy.fence);
  e.state = SwapState::Reloaded;
  e.gets_since_reload = 0;
  ++e.generation;
  copy_launched(e, cause, copy.host_seconds, counters_);
  report_landing(e);  // a synchronous copy has landed already
}

void SwapCore::reload_ahead_locked(SwapEntry& e) {
  if (e.state == SwapState::Offloaded) {
    launch_reload_locked(e, events::CopyCause::Prefetch);
  } else if (e.state == SwapState::Offloading) {
    e.keep_on_device = true;
  }
}

bool SwapCore::reload_group_locked(SwapGroups::Group& group, const SwapEntry* asking) {
  for (SwapEntry* e : group.tensors) {
    if (e != asking) reload_ahead_locked(*e);
  }
  return !group.tensors.empty();  // released tensors leave their group
}

void SwapCore::use_group_locked(int64_t id, const SwapEntry* asking) {
  SwapGroups::Group* group = groups_.find(id);
  if (!group || group->used) return;
  group->used = true;
  reload_group_locked(*group, asking);
  // Lookahead: the nearest earlier groups that still hold tensors.
  int64_t remaining = options_.prefetch_groups();
  if (remaining == 0) return;
  groups_.visit_newest_first(id, [&](SwapGroups::Group& earlier) {
    return !reload_group_locked(earlier, nullptr) || --remaining > 0;
  });
}

at::Tensor SwapCore::get(SwappedTensor& swapped, int64_t* generation) {
  SwapEntry& e = SwapAccess::entry(swapped);
  refuse_under_capture(e.device, "SwappedTensor::get");
  InternalOpsGuard internal;  // the reloads' allocations and copies
  std::lock_guard lock(mutex_);
  if (e.state == SwapState::Released) {
    throw CheckpointError("recompose: SwappedTensor::get: the tensor was released");
  }
  deferred_.retire();  // backward's earlier reloads, once their consumers are done with them
  use_group_locked(e.group, &e);
  if (e.state == SwapState::Offloading) {
    // Its copy to host is still in flight (or it was prefetched meanwhile): the device tensor
    // is still here, no reload needed.
    if (generation) *generation = e.generation;
    counters_.update([](SwapStats& s) { ++s.early_returns; });
    at::Tensor result = e.device_copy;
    if (++e.gets_since_reload >= e.users) let_device_copy_go_locked(e);
    return result;
  }
  if (e.state == SwapState::Offloaded) {
    launch_reload_locked(e, events::CopyCause::OnDemand);
  }
  if (generation) *generation = e.generation;
  at::Tensor result = e.reloaded;
  if (!e.fence->done()) {  // a reload not landed yet (never on devices without streams)
    reload_late(e, options_.measure_waits() ? e.fence->synchronize() : 0, counters_);
  }
  report_landing(e);
  if (const auto consumer = copies_.hand_over(*e.fence, e.device)) {
    if (std::ranges::find(e.consumers, *consumer) == e.consumers.end())
      e.consumers.push_back(*consumer);
  }
  if (++e.gets_since_reload >= e.users) let_device_copy_go_locked(e);
  return result;
}

void SwapCore::let_device_copy_go_locked(SwapEntry& e) {
  if (e.state == SwapState::Reloaded) {
    // The host copy stays (a second backward reloads); the device one goes with autograd's last
    // reference.
    let_reloaded_go_locked(e);
    e.state = SwapState::Offloaded;
  } else if (e.state == SwapState::Offloading && e.keep_on_device) {
    e.keep_on_device = false;
    if (!e.fence->done()) {
      in_flight_.push_back(&e);  // the next poll after its copy lands lets it go
      return;
    }
    report_landing(e);
    e.device_copy.reset();
    e.state = SwapState::Offloaded;
  }
}

void SwapCore::let_reloaded_go_locked(SwapEntry& e) {
  // Allocated on the copy stream and read by its consumers: held until they are done with it
  // instead of record_stream'ed on them (Note [ Swap copies and graph capture ]).
  if (e.reloaded.defined() && !e.consumers.empty())
    deferred_.until_unused(std::move(e.reloaded), std::move(e.consumers));
  e.reloaded.reset();
  e.consumers.clear();
}

void SwapCore::prefetch_newest() {
  InternalOpsGuard internal;  // the reloads' allocations and copies
  std::lock_guard lock(mutex_);
  refuse_under_capture_locked("backward's prefetch of offloaded tensors");
  int64_t remaining = options_.prefetch_groups();
  if (remaining == 0) return;
  groups_.visit_newest_first(std::nullopt, [&](SwapGroups::Group& group) {
    // Not marked used: its first use still prefetches further back.
    return group.used || !reload_group_locked(group, nullptr) || --remaining > 0;
  });
}

void SwapCore::prefetch(SwappedTensor& swapped) {
  SwapEntry& e = SwapAccess::entry(swapped);
  refuse_under_capture(e.device, "SwappedTensor::prefetch");
  InternalOpsGuard internal;  // the reload's allocation and copy
  std::lock_guard lock(mutex_);
  if (e.state == SwapState::Released) {
    throw CheckpointError("recompose: SwappedTensor::prefetch: the tensor was released");
  }
  reload_ahead_locked(e);
}

}  // namespace recompose::detail
