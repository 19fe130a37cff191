// The kept outputs of one op call that selective checkpointing saved in the forward. Kept apart
// so that activation swap (MUST_SWAP) can change how they are held (e.g. offloaded to host
// memory) without touching the interception.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
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
  // the version counter of the original, anything else as is.
  static CacheEntry capture(c10::ArrayRef<c10::IValue> outputs);

  // Pushes the kept outputs onto `stack`, each tensor as a fresh detached alias (a TensorImpl
  // nobody else uses, as OpInterceptor requires). Throws CheckpointError naming `op` if a kept
  // tensor was modified in place since capture() and !allow_mutation.
  void replay(const c10::OperatorHandle& op, int64_t call_index, bool allow_mutation,
              torch::jit::Stack* stack) const;

  // Replaces the kept tensors by copies (and records their versions anew): called before an op
  // of the same forward writes into their storage through another TensorImpl, whose version
  // counter the replay check would not see (e.g. aten::_unsafe_view followed by add_).
  void copy_on_write();

  // The storages of the kept tensors (to find the entries an in-place op writes into).
  c10::SmallVector<const c10::StorageImpl*, 4> storages() const;

  // Drops the kept outputs (after the single replay a region allows).
  void release() noexcept;

 private:
  std::vector<c10::IValue> values_;
  std::vector<uint32_t> versions_;  // one per defined tensor, in order of appearance in values_
  int64_t bytes_ = 0;               // counted in selective_checkpoint_bytes_kept()
  void account();
};

}  // namespace recompose::detail
