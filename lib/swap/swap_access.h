// The library's way into SwapManager and SwappedTensor, whose public headers expose no internals
// (both befriend this struct). Internal to lib/swap and the tests.
//   recompose::detail::SwapAccess::core(*manager)->bookkeeping_entries();
#pragma once

#include "swap/swap_entry.h"

#include <recompose/swap.h>

#include <memory>

namespace recompose::detail {

class SwapCore;

struct SwapAccess {
  static const std::shared_ptr<SwapCore>& core(const SwapManager& manager) { return manager.core_; }
  static SwapEntry& entry(const SwappedTensor& swapped) { return *swapped.entry_; }
  static std::shared_ptr<SwappedTensor> make(std::shared_ptr<SwapCore> core,
                                             std::unique_ptr<SwapEntry> entry) {
    return std::shared_ptr<SwappedTensor>(new SwappedTensor(std::move(core), std::move(entry)));
  }
};

}  // namespace recompose::detail
