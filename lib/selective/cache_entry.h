// The kept outputs of one op call that selective checkpointing saved in the forward. Kept apart
// so that activation swap (MUST_SWAP) can change how they are held (e.g. offloaded to host
// memory) without touching the interception.
#pragma once

#include "engine/meter_charge.h"
#include "plugin/offload.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace recompose::detail {

class CacheEntry {
 public:
  CacheEntry() = default;
  CacheEntry(CacheEntry&& other) noexcept;
  CacheEntry& operator=(CacheEntry&& other) noexcept;
  CacheEntry(const CacheEntry&) = delete;
  CacheEntry& operator=(const CacheEntry&) = delete;
  ~CacheEntry() { release(); }

  // Keeps `outputs` (an op's results): tensors as detached aliases that share the storage and
  // the version counter of the original, anything else as is. With `swap` (MUST_SWAP), each
  // tensor the manager finds eligible is offloaded instead: the entry then holds an empty marker
  // sharing the original's version counter, and the device memory is freed once the copy landed.
  static CacheEntry capture(c10::ArrayRef<c10::IValue> outputs, Offloader* swap = nullptr);

  // Pushes the kept outputs onto `stack`, each tensor as a fresh detached alias (a TensorImpl
  // nobody else uses, as OpInterceptor requires; with a version counter of its own once the
  // entry carries writes, see accept_write). Throws CheckpointError naming `op` if a kept
  // tensor was modified in place since capture() and !allow_mutation.
  void hand_out(const c10::OperatorHandle& op, int64_t call_index, bool allow_mutation,
                torch::jit::Stack* stack) const;

  // The check of hand_out() alone: throws CheckpointError naming `op` if a kept tensor was
  // modified in place since capture() and !allow_mutation.
  void check_unmodified(const c10::OperatorHandle& op, int64_t call_index,
                        bool allow_mutation) const;

  // Replaces the kept tensors by copies (and records their versions anew): called before an op
  // of the same forward writes into their storage through another TensorImpl, whose version
  // counter the replay check would not see (e.g. aten::_unsafe_view followed by add_).
  void copy_on_write();

  // An op of the same forward wrote into a kept tensor, and the entry keeps the value after the
  // write (ForwardTrace::carry_write): records the versions anew, so that only writes after the
  // forward count as modifications. Only for entries that offloaded nothing (offloaded()).
  void accept_write();

  // The entry carries writes of the forward (accept_write ran).
  bool carries_writes() const { return carries_writes_; }

  // A kept tensor was modified in place since capture() (or since accept_write()).
  bool modified() const;

  // Some kept tensor was offloaded (MUST_SWAP): its host copy holds the value at capture.
  bool offloaded() const;

  // The storages of the kept tensors, offloaded ones included (to find the entries an in-place
  // op writes into). Offloaded storages are only compared, never read: they may be gone.
  c10::SmallVector<const c10::StorageImpl*, 4> storages() const;

  // Device bytes the kept tensors hold (each storage once; offloaded ones hold none): what the
  // entry adds to selective_checkpoint_bytes_kept().
  int64_t bytes() const { return bytes_; }

  // The kept tensors are copies only this entry holds (copy_on_write ran): once it is released,
  // the tensors hand_out() handed out are their holder's alone.
  bool private_copies() const { return written_after_capture_; }

  // Drops the kept outputs (after the single replay a region allows).
  void release() noexcept;

 private:
  std::vector<c10::IValue> values_;
  std::vector<uint32_t> versions_;  // one per defined tensor, in order of appearance in values_
  // One per defined tensor: its offloaded copy (MUST_SWAP), or nullptr when kept on the device.
  std::vector<std::shared_ptr<OffloadedTensor>> swapped_;
  // Storages of offloaded tensors, so that an in-place write into them is still noticed.
  c10::SmallVector<const c10::StorageImpl*, 4> swapped_storages_;
  Offloader* swap_ = nullptr;  // owned by the region's selective state, which outlives entries
  // The forward wrote into these outputs after they were kept (copy_on_write ran): the
  // recomputation will write into the replayed ones too.
  bool written_after_capture_ = false;
  // The forward wrote into these outputs after they were kept and the entry holds the values
  // after the writes (accept_write): hand_out() hands out tensors with version counters of their
  // own.
  bool carries_writes_ = false;
  int64_t bytes_ = 0;  // counted in selective_checkpoint_bytes_kept()
  // The same storages, each charged to the meters and the ledger of the forward thread.
  std::vector<MeterCharge> charges_;
  void account();
  c10::SmallVector<const c10::StorageImpl*, 4> device_storages() const;
};

// Adds `delta` to selective_checkpoint_bytes_kept(): memory kept for backward beside the cache
// entries (a random op's kept draw, draw_mask.h).
void count_bytes_kept(int64_t delta) noexcept;

}  // namespace recompose::detail
