// The state of one SwapManager: groups, copies in flight, statistics, the buffer pool and
// the saved-tensor policy. Shared (shared_ptr) by the manager and every SwappedTensor it made,
// so that offloaded tensors stay valid when the manager handle goes first.
#pragma once

#include "engine/saved_tensor_policy.h"
#include "swap/host_buffer_pool.h"

#include <recompose/swap.h>

#include <c10/core/Stream.h>
#include <c10/util/intrusive_ptr.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace recompose::detail {

class SwapCore : public std::enable_shared_from_this<SwapCore> {
 public:
  explicit SwapCore(SwapOptions options);
  ~SwapCore();

  const SwapOptions& options() const { return options_; }

  int64_t begin_group();
  void end_group(int64_t id);
  // Closes group `id` wherever it is open (SwapGroupScope, after end_group refused): a scope
  // closed wrongly must not leave its group open for good.
  void force_end_group(int64_t id);
  // Starts a fresh implicit group at the next offload.
  void close_implicit_group();

  bool eligible(const at::Tensor& tensor) const;
  std::shared_ptr<SwappedTensor> offload(const at::Tensor& tensor);
  // Counts a saved tensor that a policy left on the device.
  void note_kept(const at::Tensor& tensor);

  // SwappedTensor operations.
  // `generation`, if given, receives the reload generation the caller was served from (for
  // drop_user).
  at::Tensor get(SwappedTensor& swapped, int64_t* generation = nullptr);
  void prefetch(SwappedTensor& swapped);
  // Backward started on saved tensors that never left the device (apply_offload's last call):
  // reloads the newest `prefetch_groups` groups not used yet, which backward needs next.
  void prefetch_newest();
  void release(SwappedTensor& swapped);
  // A saved-tensor hook sharing `swapped` is gone: it will not ask for it again. `served` is the
  // generation get() last served it from (-1: never served).
  void drop_user(SwappedTensor& swapped, int64_t served);
  // From ~SwappedTensor: returns its buffer.
  void destroy(SwappedTensor& swapped);
  SwapState state(const SwappedTensor& swapped) const;

  void poll();
  void synchronize();
  SwapStats stats() const;
  void reset_stats();
  int64_t pool_bytes() const;
  void clear_pool();
  int64_t tensors_alive() const;
  int64_t bytes_alive() const;
  // Entries of the internal tables (groups, group members, aliases, copies in flight): back to
  // its earlier value once the tensors offloaded since are gone. For leak tests.
  int64_t bookkeeping_entries() const;

  // Offloads every eligible saved tensor through this core (AsyncSaveOnCpu, swap_inputs).
  SavedTensorPolicy& policy() { return *policy_; }

 private:
  using Graveyard = std::vector<std::shared_ptr<SwappedTensor>>;
  // A SwappedTensor in a table: weak (the hooks own it) plus its address, which identifies it
  // without lock() when it is being destroyed.
  struct Member {
    std::weak_ptr<SwappedTensor> swapped;
    const SwappedTensor* raw;
  };
  struct Group {
    std::vector<Member> tensors;  // not released yet
    int64_t bytes = 0;
    bool used = false;  // backward asked for one of its tensors
  };
  // A live offload that a second save of the same tensor can share.
  struct Alias {
    std::weak_ptr<SwappedTensor> swapped;
    const SwappedTensor* raw;  // identity without lock()
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // keeps the key pointer from being reused
    int64_t storage_offset;
    int64_t version;
  };

  int64_t new_group_locked();
  int64_t group_for_locked(int64_t bytes);
  // Forgets group `id` once it has no tensors left and is not open (an implicit group, once
  // empty, is no longer current): the bookkeeping of a group lives as long as its tensors.
  void erase_group_if_done_locked(int64_t id);
  void set_implicit_group_locked(std::optional<int64_t> id);
  bool open_somewhere_locked(int64_t id) const;
  std::shared_ptr<SwappedTensor> find_alias_locked(const at::Tensor& source, Graveyard& graveyard);
  void launch_offload_locked(SwappedTensor& swapped, const at::Tensor& source);
  void launch_reload_locked(SwappedTensor& swapped);
  // Reload on behalf of the lookahead (no-op unless offloaded).
  void reload_ahead_locked(SwappedTensor& swapped);
  // Reloads ahead every live tensor of `group` but `asking`; false if it has none left.
  bool reload_group_locked(Group& group, const SwappedTensor* asking, Graveyard& graveyard);
  // First use of `group`: reloads its other tensors and prefetches earlier groups.
  void use_group_locked(int64_t group, const SwappedTensor* asking, Graveyard& graveyard);
  void poll_locked(Graveyard& graveyard);
  // Waits until at most max_groups_in_flight groups other than `group` have copies in flight.
  void throttle_offloads_locked(int64_t group, Graveyard& graveyard);
  void finish_offload_locked(SwappedTensor& swapped);
  void free_buffers_locked(SwappedTensor& swapped);
  c10::Stream copy_stream_locked(const c10::Device& device);
  bool pinned_for(const c10::Device& device) const;

  // Every table entry of a tensor is erased when it is released or destroyed (free_buffers_locked),
  // so that nothing grows with the number of steps.
  // Recursive: a SwappedTensor destroyed while the lock is held (its last reference was a
  // weak_ptr we locked) re-enters through destroy(). Locals named graveyard hold such
  // references until after the lock is released.
  mutable std::recursive_mutex mutex_;
  const SwapOptions options_;
  SwapStats stats_;
  HostBufferPool pool_;
  std::unordered_map<c10::Device, c10::Stream> copy_streams_;
  std::map<int64_t, Group> groups_;
  // Explicit groups open, per thread (innermost last): threads that share a manager do not
  // close each other's groups.
  std::unordered_map<std::thread::id, std::vector<int64_t>> open_groups_;
  std::optional<int64_t> implicit_group_;
  int64_t next_group_ = 0;
  std::deque<Member> in_flight_;  // Offloading, in launch order
  std::unordered_map<const c10::StorageImpl*, std::vector<Alias>> aliases_;
  int64_t tensors_alive_ = 0;
  int64_t bytes_alive_ = 0;
  std::unique_ptr<SavedTensorPolicy> policy_;
};

}  // namespace recompose::detail
