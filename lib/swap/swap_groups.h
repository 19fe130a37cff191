// The swap groups of one SwapManager: ids in forward order, the tensors of each, the explicit
// groups open on each thread (threads sharing a manager do not close each other's) and the
// current implicit group. Not thread-safe: SwapCore calls it under its mutex.
#pragma once

#include "swap/swap_counters.h"
#include "swap/swap_entry.h"

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

namespace recompose::detail {

class SwapGroups {
 public:
  struct Group {
    std::vector<SwapEntry*> tensors;  // not released yet
    int64_t bytes = 0;
    bool used = false;  // backward asked for one of its tensors
  };

  // `counters` counts the groups opened; `implicit_group_bytes`: SwapOptions.
  SwapGroups(SwapCounters& counters, int64_t implicit_group_bytes)
      : counters_(counters), implicit_group_bytes_(implicit_group_bytes) {}

  // Opens an explicit group on this thread and returns its id.
  int64_t open();
  // Closes `id`, the innermost open group of this thread; throws CheckpointError otherwise,
  // saying what is in the way.
  void close(int64_t id);
  // Closes `id` wherever it is open (a scope closed wrongly must not leave it open for good).
  void force_close(int64_t id);
  // The next tensor outside explicit groups starts a fresh implicit group.
  void close_implicit();

  // The group a tensor of `bytes` offloaded on this thread joins: the innermost open group of
  // the thread, else the implicit group while it has room, else a new implicit group.
  int64_t group_for(int64_t bytes);
  void add(SwapEntry& entry);
  // Takes a released tensor out of its group, and forgets the group once it is empty and not
  // open: the bookkeeping of a group lives as long as its tensors.
  void remove(const SwapEntry& entry);

  Group* find(int64_t id);
  // Calls `visit` on the groups before `id` (all groups if `id` is null), newest first, while it
  // returns true.
  template <class Visit>
  void visit_newest_first(std::optional<int64_t> id, Visit&& visit) {
    auto start = id ? groups_.find(*id) : groups_.end();
    if (id && start == groups_.end()) return;
    for (auto it = std::make_reverse_iterator(start); it != groups_.rend(); ++it) {
      if (!visit(it->second)) return;
    }
  }

  // Table entries, for the leak tests (SwapCore::bookkeeping_entries).
  int64_t entries() const;

 private:
  int64_t create();
  void erase_if_done(int64_t id);
  void set_implicit(std::optional<int64_t> id);
  bool open_somewhere(int64_t id) const;

  SwapCounters& counters_;
  const int64_t implicit_group_bytes_;
  std::map<int64_t, Group> groups_;
  // Explicit groups open, per thread (innermost last).
  std::unordered_map<std::thread::id, std::vector<int64_t>> open_;
  std::optional<int64_t> implicit_;
  int64_t next_ = 0;
};

}  // namespace recompose::detail
