#include "swap/swap_core.h"

#include "engine/internal_ops.h"
#include "swap/eligibility.h"
#include "swap/entry_events.h"
#include "swap/stream_capture.h"
#include "swap/swap_access.h"

#include <recompose/checkpoint_error.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace recompose::detail {

SwapCore::SwapCore(SwapOptions options)
    : options_(check_swap_options(std::move(options))),
      groups_(counters_, options_.implicit_group_bytes()) {}

SwapCore::~SwapCore() {
  // What a stream may still read waits for it (never under a capture, where waiting is illegal).
  if (stream_device_ && may_poll(*stream_device_)) deferred_.drain();
}

int64_t SwapCore::begin_group() {
  std::lock_guard lock(mutex_);
  poll_locked();
  return groups_.open();
}

void SwapCore::end_group(int64_t id) {
  std::lock_guard lock(mutex_);
  groups_.close(id);
  poll_locked();
}

void SwapCore::force_end_group(int64_t id) {
  std::lock_guard lock(mutex_);
  groups_.force_close(id);
  poll_locked();
}

void SwapCore::close_implicit_group() {
  std::lock_guard lock(mutex_);
  groups_.close_implicit();
}

bool SwapCore::eligible(const at::Tensor& tensor) const {
  return worth_offloading(tensor, options_);
}

std::optional<events::KeptReason> SwapCore::why_kept(const at::Tensor& tensor) const {
  return kept_reason(tensor, options_);
}

void SwapCore::note_kept(const at::Tensor& tensor, events::KeptReason why,
                         const events::Tag& region) {
  const auto bytes = static_cast<int64_t>(tensor.nbytes());
  counters_.update([&](SwapStats& s) {
    ++s.tensors_kept;
    s.bytes_kept += bytes;
  });
  if (region) events::kept(*region, why, bytes);
}

std::shared_ptr<SwappedTensor> SwapCore::offload(const at::Tensor& tensor) {
  return offload(tensor, events::forward_tag());
}

std::shared_ptr<SwappedTensor> SwapCore::offload(const at::Tensor& tensor, events::Tag region) {
  if (const auto why = unsupported_for_swap(tensor); !why.empty()) {
    throw CheckpointError("recompose: SwapManager::offload: cannot offload this tensor: " + why);
  }
  refuse_under_capture(tensor.device(), "SwapManager::offload");
  // The detach, the buffer, its view and the copy are recompose's ops, not the user's.
  InternalOpsGuard internal;
  at::Tensor source = tensor.detach();
  // Made before the lock: if the copy throws, the handle's destructor (release) runs after the
  // lock is given back.
  auto swapped = SwapAccess::make(shared_from_this(), std::make_unique<SwapEntry>(source));
  SwapEntry& entry = SwapAccess::entry(*swapped);
  entry.region = std::move(region);
  std::lock_guard lock(mutex_);
  poll_locked();
  if (SwapEntry* alias = aliases_.find(source)) {
    if (auto shared = alias->handle.lock()) {
      ++alias->users;
      counters_.update([](SwapStats& s) { ++s.shared_offloads; });
      return shared;
    }
  }
  entry.group = groups_.group_for(entry.nbytes);
  throttle_offloads_locked(entry.group);
  launch_offload_locked(entry, source);
  entry.users = 1;
  entry.handle = swapped;
  ++tensors_alive_;
  bytes_alive_ += entry.nbytes;
  groups_.add(entry);
  aliases_.add(entry, source);
  in_flight_.push_back(&entry);
  // Lets the source go right away when the copy is synchronous (CPU, pageable memory).
  poll_locked();
  return swapped;
}

void SwapCore::launch_offload_locked(SwapEntry& e, const at::Tensor& source) {
  copy_begins(e, events::CopyDirection::ToHost);
  at::NoGradGuard no_grad;
  e.pinned = options_.pin_memory() && uses_streams(e.device);
  auto [buffer, hit] = pool_.acquire(e.device, source.scalar_type(), source.numel(), e.pinned);
  e.host_buffer = std::move(buffer);
  // Dense tensors keep their strides (a permutation of contiguous ones fits the 1-D buffer).
  e.host_view = source.is_non_overlapping_and_dense()
                    ? e.host_buffer.as_strided(source.sizes(), source.strides())
                    : e.host_buffer.view(source.sizes());
  copy_launching(e);
  // The source is not record_stream'ed: e.device_copy holds it until the copy has landed, and
  // release() before then leaves it to deferred_ (Note [ Swap copies and graph capture ]).
  auto copy = copies_.launch(
      e.device, e.pinned, /*after_current_work=*/true,
      [&](bool non_blocking, const c10::Stream*) { e.host_view.copy_(source, non_blocking); });
  if (uses_streams(e.device)) stream_device_ = e.device;
  e.fence = std::move(copy.fence);
  e.device_copy = source;
  e.state = SwapState::Offloading;
  counters_.update([&](SwapStats& s) { ++(hit ? s.pool_hits : s.pool_misses); });
  copy_launched(e, events::CopyCause::Offload, copy.host_seconds, counters_);
}

void SwapCore::poll_locked() {
  if (in_flight_.empty() && deferred_.size() == 0) return;
  // Under a capture the events cannot be queried: the next poll outside it retires them.
  if (stream_device_ && !may_poll(*stream_device_)) return;
  deferred_.retire();
  while (!in_flight_.empty()) {
    SwapEntry& e = *in_flight_.front();
    // Copies on one stream land in order (Note [ Fences complete in record order ]).
    if (e.state == SwapState::Offloading && !e.fence->done()) break;
    in_flight_.pop_front();
    report_landing(e);
    // Prefetched before its copy landed: backward gets the device tensor itself; finished
    // when its last user has it (get).
    if (e.state == SwapState::Offloading && !e.keep_on_device) {
      e.device_copy.reset();
      e.state = SwapState::Offloaded;
    }
  }
}

void SwapCore::throttle_offloads_locked(int64_t group) {
  const auto limit = static_cast<size_t>(options_.max_groups_in_flight());
  if (limit == 0) return;
  // The groups with copies in flight, oldest first, each with the fence of its newest copy
  // (copies on one stream land in order, Note [ Fences complete in record order ]: when that
  // fence is done, the whole group is).
  auto groups_in_flight = [&] {
    std::vector<std::pair<int64_t, std::shared_ptr<CopyFence>>> groups;
    for (const SwapEntry* e : in_flight_) {
      if (e->state != SwapState::Offloading || e->group == group) continue;
      auto it = std::ranges::find(groups, e->group, &decltype(groups)::value_type::first);
      if (it == groups.end())
        groups.emplace_back(e->group, e->fence);
      else
        it->second = e->fence;
    }
    return groups;
  };
  auto groups = groups_in_flight();
  while (groups.size() >= limit) {
    if (!groups.front().second->done()) {
      const double waited = groups.front().second->synchronize();
      counters_.update([&](SwapStats& s) {
        s.wait_seconds += waited;
        ++s.offload_waits;
      });
    }
    poll_locked();
    auto after = groups_in_flight();
    if (after.size() >= groups.size()) return;  // poll could not retire it: never spin
    groups = std::move(after);
  }
}

void SwapCore::poll() {
  std::lock_guard lock(mutex_);
  poll_locked();
}

void SwapCore::synchronize() {
  {
    std::lock_guard lock(mutex_);
    refuse_under_capture_locked("SwapManager::synchronize");
  }
  double waited = copies_.synchronize();
  std::lock_guard lock(mutex_);
  waited += deferred_.drain();
  counters_.update([&](SwapStats& s) { s.wait_seconds += waited; });
  poll_locked();
}

void SwapCore::refuse_under_capture_locked(std::string_view call) const {
  if (stream_device_) refuse_under_capture(*stream_device_, call);
}

void SwapCore::release(SwapEntry& e) {
  std::lock_guard lock(mutex_);
  if (e.state == SwapState::Released) return;  // released before, or never launched
  if (e.host_buffer.defined()) {
    pool_.release(e.device, std::move(e.host_buffer), e.pinned, e.fence, options_.max_pool_bytes());
  }
  e.host_buffer.reset();
  e.host_view.reset();
  // Released before its copy to host was seen landing: the copy may still read the source. No
  // event is queried here (a destructor, maybe under a capture): the next poll retires it.
  if (e.state == SwapState::Offloading && e.device_copy.defined() && uses_streams(e.device))
    deferred_.until_complete(std::move(e.device_copy), e.fence);
  e.device_copy.reset();
  let_reloaded_go_locked(e);
  e.state = SwapState::Released;
  --tensors_alive_;
  bytes_alive_ -= e.nbytes;
  // Every table entry of the tensor goes with it, so that nothing grows with the number of steps.
  aliases_.remove(e);
  std::erase(in_flight_, &e);
  groups_.remove(e);
}

void SwapCore::drop_user(SwappedTensor& swapped, int64_t served) {
  SwapEntry& e = SwapAccess::entry(swapped);
  std::lock_guard lock(mutex_);
  if (e.state == SwapState::Released) return;
  --e.users;
  // A user served from the current copy no longer counts on either side.
  if (served == e.generation && e.gets_since_reload > 0) --e.gets_since_reload;
  // Nobody else will ask: let the device copy go.
  if (e.gets_since_reload >= e.users) let_device_copy_go_locked(e);
}

SwapState SwapCore::state(const SwapEntry& e) const {
  std::lock_guard lock(mutex_);
  return e.state;
}

int64_t SwapCore::bookkeeping_entries() const {
  std::lock_guard lock(mutex_);
  return groups_.entries() + aliases_.entries() + static_cast<int64_t>(in_flight_.size());
}

}  // namespace recompose::detail
