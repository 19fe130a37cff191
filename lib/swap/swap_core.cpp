#include "swap/swap_core.h"

#include "engine/internal_ops.h"
#include "swap/copy_fence.h"
#include "swap/swap_hooks.h"

#include <recompose/checkpoint_error.h>

#include <ATen/ops/empty_strided.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace recompose::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Why `tensor` cannot be offloaded at all, or "" if it can.
std::string unsupported(const at::Tensor& tensor) {
  if (!tensor.defined()) return "it is undefined";
  if (tensor.layout() != c10::kStrided) return "its layout is not strided";
  if (tensor.is_nested()) return "it is a nested tensor";
  if (tensor.is_quantized()) return "it is quantized";
  if (tensor.is_meta()) return "it is on the meta device";
  if (tensor.unsafeGetTensorImpl()->has_storage() == false) return "it has no storage";
  return "";
}

// Options are arguments: a bad one is std::invalid_argument, naming it and what it means.
void check_at_least(const char* name, int64_t value, int64_t least, const char* meaning) {
  if (value >= least) return;
  throw std::invalid_argument(std::string("recompose::SwapOptions: ") + name + " must be >= " +
                              std::to_string(least) + " (" + meaning + "), got " + std::to_string(value));
}

}  // namespace

SwapCore::SwapCore(SwapOptions options)
    : options_(std::move(options)), policy_(std::make_unique<SwapPolicy>(*this)) {
  check_at_least("min_bytes", options_.min_bytes(), 0, "0 offloads every eligible tensor");
  check_at_least("prefetch_groups", options_.prefetch_groups(), 0, "0 loads each group on demand");
  check_at_least("implicit_group_bytes", options_.implicit_group_bytes(), 0,
                 "0 gives each tensor outside explicit groups a group of its own");
  check_at_least("max_pool_bytes", options_.max_pool_bytes(), -1, "-1 for no limit, 0 for no pool");
  check_at_least("max_groups_in_flight", options_.max_groups_in_flight(), 0, "0 for no limit");
}

SwapCore::~SwapCore() = default;

// ---------------------------------------------------------------------------------------------
// Groups

int64_t SwapCore::new_group_locked() {
  const int64_t id = next_group_++;
  groups_[id];
  ++stats_.groups;
  return id;
}

void SwapCore::erase_group_if_done_locked(int64_t id) {
  auto it = groups_.find(id);
  if (it == groups_.end() || !it->second.tensors.empty() || open_somewhere_locked(id)) return;
  // An emptied implicit group is forgotten too: the next offload starts a new one.
  if (implicit_group_ == id) implicit_group_.reset();
  groups_.erase(it);
}

bool SwapCore::open_somewhere_locked(int64_t id) const {
  for (const auto& [thread, open] : open_groups_) {
    if (std::find(open.begin(), open.end(), id) != open.end()) return true;
  }
  return false;
}

void SwapCore::set_implicit_group_locked(std::optional<int64_t> id) {
  const auto previous = std::exchange(implicit_group_, id);
  if (previous) erase_group_if_done_locked(*previous);
}

int64_t SwapCore::begin_group() {
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  poll_locked(graveyard);
  set_implicit_group_locked(std::nullopt);
  const int64_t id = new_group_locked();
  open_groups_[std::this_thread::get_id()].push_back(id);
  return id;
}

void SwapCore::end_group(int64_t id) {
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  auto mine = open_groups_.find(std::this_thread::get_id());
  if (mine == open_groups_.end() || mine->second.back() != id) {
    std::string why;
    if (mine != open_groups_.end() && std::find(mine->second.begin(), mine->second.end(), id) != mine->second.end()) {
      why = "group " + std::to_string(mine->second.back()) +
            ", opened after it on this thread, is still open; groups must close in LIFO order";
    } else if (open_somewhere_locked(id)) {
      why = "it was opened on another thread; close a group on the thread that opened it";
    } else {
      why = "it is not open";
    }
    throw CheckpointError("recompose::SwapManager::end_group(" + std::to_string(id) +
                          "): not the innermost open group of this thread: " + why);
  }
  mine->second.pop_back();
  if (mine->second.empty()) open_groups_.erase(mine);
  erase_group_if_done_locked(id);
  set_implicit_group_locked(std::nullopt);
  poll_locked(graveyard);
}

void SwapCore::force_end_group(int64_t id) {
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  for (auto it = open_groups_.begin(); it != open_groups_.end();) {
    std::erase(it->second, id);
    it = it->second.empty() ? open_groups_.erase(it) : std::next(it);
  }
  erase_group_if_done_locked(id);
  set_implicit_group_locked(std::nullopt);
  poll_locked(graveyard);
}

void SwapCore::close_implicit_group() {
  std::lock_guard lock(mutex_);
  set_implicit_group_locked(std::nullopt);
}

int64_t SwapCore::group_for_locked(int64_t bytes) {
  if (auto mine = open_groups_.find(std::this_thread::get_id()); mine != open_groups_.end()) {
    return mine->second.back();
  }
  if (implicit_group_) {
    auto it = groups_.find(*implicit_group_);
    if (it != groups_.end() &&
        (it->second.bytes == 0 || it->second.bytes + bytes <= options_.implicit_group_bytes())) {
      return *implicit_group_;
    }
  }
  set_implicit_group_locked(new_group_locked());
  return *implicit_group_;
}

// ---------------------------------------------------------------------------------------------
// Offload

bool SwapCore::eligible(const at::Tensor& tensor) const {
  if (!unsupported(tensor).empty()) return false;
  const auto nbytes = static_cast<int64_t>(tensor.nbytes());
  if (nbytes == 0 || nbytes < options_.min_bytes()) return false;
  // Parameters and their views: the module keeps them anyway.
  if (tensor.is_leaf() && tensor.requires_grad()) return false;
  if (tensor.is_view()) {
    const auto& base = tensor._base();
    if (base.is_leaf() && base.requires_grad()) return false;
  }
  // Slices and broadcasts: the storage outlives the offload, so nothing would be freed.
  if (!tensor.is_non_overlapping_and_dense()) return false;
  if (static_cast<int64_t>(tensor.storage().nbytes()) != nbytes) return false;
  if (tensor.is_conj() || tensor.is_neg()) return false;
  if (options_.filter() && !options_.filter()(tensor)) return false;
  return true;
}

void SwapCore::note_kept(const at::Tensor& tensor) {
  std::lock_guard lock(mutex_);
  ++stats_.tensors_kept;
  stats_.bytes_kept += static_cast<int64_t>(tensor.nbytes());
}

bool SwapCore::pinned_for(const c10::Device& device) const {
  return options_.pin_memory() && uses_streams(device);
}

c10::Stream SwapCore::copy_stream_locked(const c10::Device& device) {
  auto it = copy_streams_.find(device);
  if (it == copy_streams_.end()) it = copy_streams_.emplace(device, side_stream(device)).first;
  return it->second;
}

std::shared_ptr<SwappedTensor> SwapCore::find_alias_locked(const at::Tensor& source, Graveyard& graveyard) {
  auto it = aliases_.find(source.storage().unsafeGetStorageImpl());
  if (it == aliases_.end()) return nullptr;
  const int64_t version = source._version();
  for (const auto& alias : it->second) {
    auto s = alias.swapped.lock();
    if (!s) continue;
    graveyard.push_back(s);
    if (s->state_ == SwapState::Released || alias.storage.expired()) continue;
    if (alias.storage_offset != source.storage_offset() || alias.version != version) continue;
    if (s->host_view_.scalar_type() != source.scalar_type() || s->host_view_.sizes() != source.sizes() ||
        s->host_view_.strides() != source.strides()) {
      continue;
    }
    return s;
  }
  return nullptr;
}

std::shared_ptr<SwappedTensor> SwapCore::offload(const at::Tensor& tensor) {
  if (const auto why = unsupported(tensor); !why.empty()) {
    throw CheckpointError("recompose::SwapManager::offload: cannot offload this tensor: " + why);
  }
  // The detach, the buffer, its view and the copy are recompose's ops, not the user's.
  InternalOpsGuard internal;
  at::Tensor source = tensor.detach();
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  poll_locked(graveyard);
  if (auto shared = find_alias_locked(source, graveyard)) {
    ++shared->users_;
    ++stats_.shared_offloads;
    return shared;
  }
  const int64_t group = group_for_locked(static_cast<int64_t>(source.nbytes()));
  throttle_offloads_locked(group, graveyard);
  std::shared_ptr<SwappedTensor> swapped(new SwappedTensor(shared_from_this(), source, group));
  launch_offload_locked(*swapped, source);
  swapped->users_ = 1;
  auto& g = groups_[group];
  g.tensors.push_back(Member{swapped, swapped.get()});
  g.bytes += swapped->nbytes();
  swapped->storage_key_ = source.storage().unsafeGetStorageImpl();
  aliases_[swapped->storage_key_].push_back(
      Alias{swapped, swapped.get(), source.storage().getWeakStorageImpl(), source.storage_offset(), source._version()});
  in_flight_.push_back(Member{swapped, swapped.get()});
  ++tensors_alive_;
  bytes_alive_ += swapped->nbytes();
  // Lets the source go right away when the copy is synchronous (CPU, pageable memory).
  poll_locked(graveyard);
  return swapped;
}

void SwapCore::launch_offload_locked(SwappedTensor& s, const at::Tensor& source) {
  at::NoGradGuard no_grad;
  const c10::Device device = source.device();
  s.pinned_ = pinned_for(device);
  auto [buffer, hit] = pool_.acquire(device, source.scalar_type(), source.numel(), s.pinned_);
  ++(hit ? stats_.pool_hits : stats_.pool_misses);
  s.host_buffer_ = std::move(buffer);
  // Dense tensors keep their strides (a permutation of contiguous ones fits the 1-D buffer).
  s.host_view_ = source.is_non_overlapping_and_dense() ? s.host_buffer_.as_strided(source.sizes(), source.strides())
                                                       : s.host_buffer_.view(source.sizes());
  if (uses_streams(device)) {
    const c10::Stream compute = current_stream(device);
    const c10::Stream copy = copy_stream_locked(device);
    // The copy must not start before the kernels that produce the source.
    CopyFence::record(compute)->block(copy);
    const auto start = Clock::now();
    {
      c10::StreamGuard on_copy(copy);
      s.host_view_.copy_(source, /*non_blocking=*/s.pinned_);
    }
    if (!s.pinned_) stats_.wait_seconds += seconds_since(start);
    // The caching allocator must not reuse the source's memory until the copy has read it,
    // even if every reference to it is dropped before then.
    source.record_stream(copy);
    s.fence_ = CopyFence::record(copy);
  } else {
    const auto start = Clock::now();
    s.host_view_.copy_(source);
    stats_.wait_seconds += seconds_since(start);
    s.fence_ = std::make_shared<CopyFence>();
  }
  s.device_copy_ = source;
  s.state_ = SwapState::Offloading;
  ++stats_.tensors_offloaded;
  stats_.bytes_offloaded += s.nbytes();
}

void SwapCore::finish_offload_locked(SwappedTensor& s) {
  s.device_copy_.reset();
  s.state_ = SwapState::Offloaded;
}

void SwapCore::poll_locked(Graveyard& graveyard) {
  while (!in_flight_.empty()) {
    auto s = in_flight_.front().swapped.lock();
    if (s) graveyard.push_back(s);
    if (!s || s->state_ != SwapState::Offloading) {
      in_flight_.pop_front();
      continue;
    }
    if (!s->fence_->done()) break;  // copies on one stream land in order
    in_flight_.pop_front();
    // Prefetched before its copy landed: backward gets the device tensor itself; finished
    // when its last user has it (get).
    if (!s->keep_on_device_) finish_offload_locked(*s);
  }
}

void SwapCore::throttle_offloads_locked(int64_t group, Graveyard& graveyard) {
  const auto limit = static_cast<size_t>(options_.max_groups_in_flight());
  if (limit == 0) return;
  // The groups with copies in flight, oldest first, each with the fence of its newest copy
  // (copies on one stream land in order: when that fence is done, the whole group is).
  auto groups_in_flight = [&] {
    std::vector<std::pair<int64_t, std::shared_ptr<CopyFence>>> groups;
    for (const Member& m : in_flight_) {
      auto s = m.swapped.lock();
      if (!s || s->state_ != SwapState::Offloading || s->group_ == group) continue;
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == s->group_; });
      if (it == groups.end()) groups.emplace_back(s->group_, s->fence_);
      else it->second = s->fence_;
    }
    return groups;
  };
  auto groups = groups_in_flight();
  while (groups.size() >= limit) {
    if (!groups.front().second->done()) {
      const auto start = Clock::now();
      groups.front().second->synchronize();
      stats_.wait_seconds += seconds_since(start);
      ++stats_.offload_waits;
    }
    poll_locked(graveyard);
    auto after = groups_in_flight();
    if (after.size() >= groups.size()) return;  // poll could not retire it: never spin
    groups = std::move(after);
  }
}

void SwapCore::poll() {
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  poll_locked(graveyard);
}

void SwapCore::synchronize() {
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  const auto start = Clock::now();
  for (const auto& [device, stream] : copy_streams_) {
    synchronize_stream(stream);
  }
  stats_.wait_seconds += seconds_since(start);
  poll_locked(graveyard);
}

// ---------------------------------------------------------------------------------------------
// Reload

void SwapCore::launch_reload_locked(SwappedTensor& s) {
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions().dtype(s.host_view_.scalar_type()).device(s.device_);
  if (uses_streams(s.device_)) {
    const c10::Stream copy = copy_stream_locked(s.device_);
    c10::StreamGuard on_copy(copy);
    // Allocated on the copy stream; get() records it on the stream that consumes it.
    s.reloaded_ = at::empty_strided(s.host_view_.sizes(), s.host_view_.strides(), options);
    const auto start = Clock::now();
    s.reloaded_.copy_(s.host_view_, /*non_blocking=*/s.pinned_);
    if (!s.pinned_) stats_.wait_seconds += seconds_since(start);
    s.fence_ = CopyFence::record(copy);
  } else {
    const auto start = Clock::now();
    s.reloaded_ = at::empty_strided(s.host_view_.sizes(), s.host_view_.strides(), options);
    s.reloaded_.copy_(s.host_view_);
    stats_.wait_seconds += seconds_since(start);
    s.fence_ = std::make_shared<CopyFence>();
  }
  s.state_ = SwapState::Reloaded;
  s.gets_since_reload_ = 0;
  ++s.generation_;
  ++stats_.tensors_reloaded;
  stats_.bytes_reloaded += s.nbytes();
}

void SwapCore::reload_ahead_locked(SwappedTensor& s) {
  if (s.state_ == SwapState::Offloaded) {
    launch_reload_locked(s);
    ++stats_.prefetched;
  } else if (s.state_ == SwapState::Offloading) {
    s.keep_on_device_ = true;
  }
}

bool SwapCore::reload_group_locked(Group& group, const SwappedTensor* asking, Graveyard& graveyard) {
  bool live = false;
  for (const auto& member : group.tensors) {
    auto s = member.swapped.lock();
    if (!s) continue;
    graveyard.push_back(s);
    if (s->state_ == SwapState::Released) continue;
    live = true;
    if (s.get() != asking) reload_ahead_locked(*s);
  }
  return live;
}

void SwapCore::use_group_locked(int64_t group, const SwappedTensor* asking, Graveyard& graveyard) {
  auto it = groups_.find(group);
  if (it == groups_.end() || it->second.used) return;
  it->second.used = true;
  reload_group_locked(it->second, asking, graveyard);
  // Lookahead: the nearest earlier groups that still hold tensors.
  int64_t remaining = options_.prefetch_groups();
  for (auto prev = std::make_reverse_iterator(it); prev != groups_.rend() && remaining > 0; ++prev) {
    if (reload_group_locked(prev->second, nullptr, graveyard)) --remaining;
  }
}

at::Tensor SwapCore::get(SwappedTensor& s, int64_t* generation) {
  InternalOpsGuard internal;  // the reloads' allocations and copies
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  if (s.state_ == SwapState::Released) {
    throw CheckpointError("recompose::SwappedTensor::get: the tensor was released");
  }
  use_group_locked(s.group_, &s, graveyard);
  at::Tensor result;
  if (generation) *generation = s.generation_;
  if (s.state_ == SwapState::Offloading) {
    // Its copy to host is still in flight (or it was prefetched meanwhile): the device tensor
    // is still here, no reload needed.
    result = s.device_copy_;
    ++stats_.early_returns;
    if (++s.gets_since_reload_ >= s.users_ && s.keep_on_device_) {
      s.keep_on_device_ = false;
      if (s.fence_->done()) finish_offload_locked(s);
      else in_flight_.push_back(Member{s.weak_from_this(), &s});
    }
    return result;
  }
  if (s.state_ == SwapState::Offloaded) {
    launch_reload_locked(s);
    ++stats_.sync_loads;
  }
  if (generation) *generation = s.generation_;
  result = s.reloaded_;
  if (uses_streams(s.device_)) {
    const c10::Stream consumer = current_stream(s.device_);
    if (!s.fence_->done()) {
      ++stats_.late_reloads;
      if (options_.measure_waits()) {
        const auto start = Clock::now();
        s.fence_->synchronize();
        stats_.wait_seconds += seconds_since(start);
      }
    }
    s.fence_->block(consumer);
    // Allocated on the copy stream: keep the allocator from reusing it while `consumer` reads it.
    result.record_stream(consumer);
  }
  if (++s.gets_since_reload_ >= s.users_) {
    // Every user has it: the host copy stays (a second backward reloads), the device one goes
    // with autograd's last reference.
    s.reloaded_.reset();
    s.state_ = SwapState::Offloaded;
  }
  return result;
}

void SwapCore::prefetch_newest() {
  InternalOpsGuard internal;  // the reloads' allocations and copies
  Graveyard graveyard;
  std::lock_guard lock(mutex_);
  int64_t remaining = options_.prefetch_groups();
  for (auto it = groups_.rbegin(); it != groups_.rend() && remaining > 0; ++it) {
    // Not marked used: its first use still prefetches further back.
    if (!it->second.used && reload_group_locked(it->second, nullptr, graveyard)) --remaining;
  }
}

void SwapCore::prefetch(SwappedTensor& s) {
  InternalOpsGuard internal;  // the reload's allocation and copy
  std::lock_guard lock(mutex_);
  if (s.state_ == SwapState::Released) {
    throw CheckpointError("recompose::SwappedTensor::prefetch: the tensor was released");
  }
  reload_ahead_locked(s);
}

// ---------------------------------------------------------------------------------------------
// Lifetime

void SwapCore::free_buffers_locked(SwappedTensor& s) {
  if (s.state_ == SwapState::Released) return;
  if (s.host_buffer_.defined()) {
    pool_.release(s.device_, std::move(s.host_buffer_), s.pinned_, s.fence_, options_.max_pool_bytes());
  }
  s.host_buffer_.reset();
  s.host_view_.reset();
  s.device_copy_.reset();
  s.reloaded_.reset();
  s.state_ = SwapState::Released;
  --tensors_alive_;
  bytes_alive_ -= s.nbytes();
  // No lock() below: a reference dropped under the mutex would re-enter destroy().
  if (auto it = aliases_.find(s.storage_key_); it != aliases_.end()) {
    std::erase_if(it->second, [&](const Alias& alias) { return alias.raw == &s || alias.swapped.expired(); });
    if (it->second.empty()) aliases_.erase(it);
  }
  std::erase_if(in_flight_, [&](const Member& m) { return m.raw == &s; });
  if (auto it = groups_.find(s.group_); it != groups_.end()) {
    auto& tensors = it->second.tensors;
    // Backward frees tensors about in reverse order of offload: search from the back.
    auto member = std::find_if(tensors.rbegin(), tensors.rend(), [&](const Member& m) { return m.raw == &s; });
    if (member != tensors.rend()) tensors.erase(std::next(member).base());
    erase_group_if_done_locked(s.group_);
  }
}

void SwapCore::release(SwappedTensor& s) {
  std::lock_guard lock(mutex_);
  free_buffers_locked(s);
}

void SwapCore::destroy(SwappedTensor& s) {
  std::lock_guard lock(mutex_);
  free_buffers_locked(s);
}

void SwapCore::drop_user(SwappedTensor& s, int64_t served) {
  std::lock_guard lock(mutex_);
  if (s.state_ == SwapState::Released) return;
  --s.users_;
  // A user served from the current copy no longer counts on either side.
  if (served == s.generation_ && s.gets_since_reload_ > 0) --s.gets_since_reload_;
  if (s.gets_since_reload_ < s.users_) return;
  // Nobody else will ask: let the device copy go.
  if (s.state_ == SwapState::Reloaded) {
    s.reloaded_.reset();
    s.state_ = SwapState::Offloaded;
  } else if (s.state_ == SwapState::Offloading && s.keep_on_device_) {
    s.keep_on_device_ = false;
    in_flight_.push_back(Member{s.weak_from_this(), &s});
  }
}

SwapState SwapCore::state(const SwappedTensor& s) const {
  std::lock_guard lock(mutex_);
  return s.state_;
}

// ---------------------------------------------------------------------------------------------
// Statistics and pool

SwapStats SwapCore::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void SwapCore::reset_stats() {
  std::lock_guard lock(mutex_);
  stats_ = SwapStats{};
}

int64_t SwapCore::pool_bytes() const {
  std::lock_guard lock(mutex_);
  return pool_.idle_bytes();
}

void SwapCore::clear_pool() {
  std::lock_guard lock(mutex_);
  pool_.clear();
}

int64_t SwapCore::tensors_alive() const {
  std::lock_guard lock(mutex_);
  return tensors_alive_;
}

int64_t SwapCore::bytes_alive() const {
  std::lock_guard lock(mutex_);
  return bytes_alive_;
}

int64_t SwapCore::bookkeeping_entries() const {
  std::lock_guard lock(mutex_);
  auto n = static_cast<int64_t>(groups_.size() + in_flight_.size() + aliases_.size() + open_groups_.size());
  for (const auto& [thread, open] : open_groups_) n += static_cast<int64_t>(open.size());
  for (const auto& [id, group] : groups_) n += static_cast<int64_t>(group.tensors.size());
  for (const auto& [key, list] : aliases_) n += static_cast<int64_t>(list.size());
  return n;
}

}  // namespace recompose::detail
