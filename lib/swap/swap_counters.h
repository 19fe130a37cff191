// The SwapStats of one manager, updated from any thread. Its mutex is a leaf: nothing is called
// while it is held, so any other lock may be held around an update.
#pragma once

#include <recompose/swap.h>

#include <mutex>

namespace recompose::detail {

class SwapCounters {
 public:
  // Applies `change` to the counters, atomically with respect to other updates and snapshots.
  //   counters.update([](SwapStats& s) { ++s.prefetched; });
  template <class Change>
  void update(Change&& change) {
    std::lock_guard lock(mutex_);
    change(stats_);
  }
  SwapStats snapshot() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset() {
    std::lock_guard lock(mutex_);
    stats_ = SwapStats{};
  }

 private:
  mutable std::mutex mutex_;
  SwapStats stats_;
};

}  // namespace recompose::detail
