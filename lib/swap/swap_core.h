// The state of one SwapManager: the offloaded tensors' entries, their groups and aliases, the
// copies to host in flight, and the copy state machine (Offloading -> Offloaded -> Reloaded ->
// Offloaded ... -> Released). Shared (shared_ptr) by the manager, every SwappedTensor it made and
// every scope that uses it, so that offloaded tensors stay valid when the manager handle goes
// first.
//
// Locking: one std::mutex guards the entries' state, the groups, the aliases and the queue of
// copies in flight. Its parts with their own state (CopyEngine, HostBufferPool, SwapCounters)
// lock leaf mutexes of their own, taken under it and never calling out. Nothing run under the
// core's mutex can destroy a SwappedTensor (the tables hold no handle), so it is never
// re-entered. See Note [ Swap lifetimes ] and Note [ Swap copies ].
#pragma once

#include "events/kept_reason.h"
#include "swap/copy_engine.h"
#include "swap/deferred_release.h"
#include "swap/host_buffer_pool.h"
#include "swap/swap_aliases.h"
#include "swap/swap_counters.h"
#include "swap/swap_entry.h"
#include "swap/swap_groups.h"

#include <recompose/swap.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

namespace recompose::detail {

class SwapCore : public std::enable_shared_from_this<SwapCore> {
 public:
  // Throws std::invalid_argument for invalid options, naming the option.
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
  // Why `tensor` stays on the device under the options (eligibility's rules, the filter asked
  // once), or nothing if it is eligible: the answer and its reason from one evaluation.
  std::optional<events::KeptReason> why_kept(const at::Tensor& tensor) const;
  // `region`: the events' tag the copies are reported with (the saver's region, null for none);
  // without it, the region whose forward runs on this thread.
  std::shared_ptr<SwappedTensor> offload(const at::Tensor& tensor);
  std::shared_ptr<SwappedTensor> offload(const at::Tensor& tensor, events::Tag region);
  // A saved tensor left on the device (not eligible, or a policy's choice), for `why`: counted in
  // SwapStats and told to the sinks through `region` (null: none listens).
  void note_kept(const at::Tensor& tensor, events::KeptReason why, const events::Tag& region);

  // SwappedTensor operations.
  // `generation`, if given, receives the reload generation the caller was served from (for
  // drop_user).
  at::Tensor get(SwappedTensor& swapped, int64_t* generation = nullptr);
  void prefetch(SwappedTensor& swapped);
  // Backward started on saved tensors that never left the device (apply_offload's last call):
  // reloads the newest `prefetch_groups` groups not used yet, which backward needs next.
  void prefetch_newest();
  // Frees the entry's buffers and takes it out of every table; later calls do nothing. From
  // SwappedTensor::release and from its destructor.
  void release(SwapEntry& entry);
  // A saved-tensor hook sharing `swapped` is gone: it will not ask for it again. `served` is the
  // generation get() last served it from (-1: never served).
  void drop_user(SwappedTensor& swapped, int64_t served);
  SwapState state(const SwapEntry& entry) const;

  void poll();
  void synchronize();
  SwapStats stats() const { return counters_.snapshot(); }
  void reset_stats() { counters_.reset(); }
  int64_t pool_bytes() const { return pool_.idle_bytes(); }
  void clear_pool() { pool_.clear(); }
  int64_t tensors_alive() const {
    std::lock_guard lock(mutex_);
    return tensors_alive_;
  }
  int64_t bytes_alive() const {
    std::lock_guard lock(mutex_);
    return bytes_alive_;
  }
  // Entries of the internal tables (groups, group members, aliases, copies in flight): back to
  // its earlier value once the tensors offloaded since are gone. For leak tests.
  int64_t bookkeeping_entries() const;

 private:
  void launch_offload_locked(SwapEntry& entry, const at::Tensor& source);
  void launch_reload_locked(SwapEntry& entry, events::CopyCause cause);
  // Reload on behalf of the lookahead (no-op unless offloaded).
  void reload_ahead_locked(SwapEntry& entry);
  // Reloads ahead every live tensor of `group` but `asking`; false if it has none left.
  bool reload_group_locked(SwapGroups::Group& group, const SwapEntry* asking);
  // First use of `group`: reloads its other tensors and prefetches earlier groups.
  void use_group_locked(int64_t group, const SwapEntry* asking);
  // Lets go of the device tensors whose copy to host has landed.
  void poll_locked();
  // Waits until at most max_groups_in_flight groups other than `group` have copies in flight.
  void throttle_offloads_locked(int64_t group);
  // Every user of a reloaded or kept device copy has it: let it go with autograd's reference.
  void let_device_copy_go_locked(SwapEntry& entry);
  // Lets go of the reloaded tensor: held in deferred_ while a stream it was handed to may read it.
  void let_reloaded_go_locked(SwapEntry& entry);
  // Throws CheckpointError, naming `call`, while the current stream of the manager's device is
  // being captured into a CUDA graph.
  void refuse_under_capture_locked(std::string_view call) const;

  const SwapOptions options_;
  SwapCounters counters_;
  HostBufferPool pool_;
  CopyEngine copies_;
  mutable std::mutex mutex_;
  SwapGroups groups_;
  SwapAliases aliases_;
  std::deque<SwapEntry*> in_flight_;  // Offloading, in launch order
  // Device tensors let go of while a stream may still read them. See Note [ Swap copies and
  // graph capture ].
  DeferredRelease deferred_;
  std::optional<c10::Device> stream_device_;  // the device of the copies on streams, if any
  int64_t tensors_alive_ = 0;
  int64_t bytes_alive_ = 0;
};

}  // namespace recompose::detail
