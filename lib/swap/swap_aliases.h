// The live offloads of one SwapManager by source storage, so that a second save of the same
// tensor (same storage, offset, version, dtype, sizes and strides) shares the first one's copy
// instead of making another. Not thread-safe: SwapCore calls it under its mutex.
#pragma once

#include "swap/swap_entry.h"

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace recompose::detail {

class SwapAliases {
 public:
  // The live offload `source` can share, or null.
  SwapEntry* find(const at::Tensor& source) const;
  void add(SwapEntry& entry, const at::Tensor& source);
  void remove(const SwapEntry& entry);
  // Table entries, for the leak tests (SwapCore::bookkeeping_entries).
  int64_t entries() const;

 private:
  struct Alias {
    SwapEntry* entry;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // keeps the key pointer from being reused
    int64_t storage_offset;
    int64_t version;
  };
  std::unordered_map<const c10::StorageImpl*, std::vector<Alias>> by_storage_;
};

}  // namespace recompose::detail
