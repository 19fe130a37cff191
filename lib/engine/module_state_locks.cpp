#include "engine/module_state_locks.h"

#include <recompose/checkpoint_error.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace recompose::detail {

namespace {

// The keys held by some scope: the thread holding each and how many of its scopes do.
struct Holding {
  std::thread::id thread;
  uint32_t scopes = 0;
};

struct KeyTable {
  std::mutex mutex;  // held only to read and update the table, never while a scope is open
  std::condition_variable released;
  std::unordered_map<const void*, Holding> held;
};

KeyTable& key_table() {
  static KeyTable table;
  return table;
}

// The highest key this thread holds (rule 2), null if none. A thread holds few keys.
thread_local c10::SmallVector<const void*, 16> held_by_this_thread;

const void* highest_held() {
  const void* highest = nullptr;
  for (const void* key : held_by_this_thread) {
    if (highest == nullptr || std::less<const void*>()(highest, key)) highest = key;
  }
  return highest;
}

// How long a nested scope that must take a key out of order waits before it gives up (rule 3),
// in milliseconds. Long enough for another thread's recomputation to end; a cycle never ends.
std::atomic<int64_t> out_of_order_patience_ms{60'000};

}  // namespace

ModuleStateLocks::ModuleStateLocks(const c10::SmallVector<const void*, 16>& keys) : keys_(keys) {
  std::sort(keys_.begin(), keys_.end(), std::less<const void*>());
  keys_.erase(std::unique(keys_.begin(), keys_.end()), keys_.end());
  KeyTable& table = key_table();
  const std::thread::id me = std::this_thread::get_id();
  std::unique_lock lock(table.mutex);
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    const void* key = keys_[i];
    auto free_or_mine = [&] {
      auto it = table.held.find(key);
      return it == table.held.end() || it->second.thread == me;
    };
    if (!free_or_mine()) {
      const void* highest = highest_held();
      if (highest == nullptr || std::less<const void*>()(highest, key)) {
        table.released.wait(lock, free_or_mine);  // rule 2: nothing above it is held here
      } else if (const std::chrono::milliseconds patience(out_of_order_patience_ms.load());
                 !table.released.wait_for(lock, patience, free_or_mine)) {
        keys_.resize(i);  // release what this scope took so far
        lock.unlock();
        release();
        throw CheckpointError(
            "recompose: a recomputation waited " + std::to_string(patience.count()) +
            " ms for the buffers and modes of modules another thread is recomputing or copying, "
            "while holding others: two threads recompute regions whose modules overlap, nested "
            "in opposite order (a checkpointed function or region that reaches modules outside "
            "its enclosing region's). Recompute such regions on one thread, or keep each "
            "region's modules within the region that encloses it. See Note [ Module state "
            "locks ] in lib/engine/module_state_locks.h.");
      }
    }
    Holding& holding = table.held[key];
    if (holding.scopes++ == 0) {
      holding.thread = me;
      held_by_this_thread.push_back(key);
    }
  }
}

std::chrono::milliseconds set_out_of_order_patience(std::chrono::milliseconds patience) {
  return std::chrono::milliseconds(out_of_order_patience_ms.exchange(patience.count()));
}

ModuleStateLocks::~ModuleStateLocks() { release(); }

ModuleStateLocks::ModuleStateLocks(ModuleStateLocks&& other) noexcept
    : keys_(std::move(other.keys_)) {
  other.keys_.clear();
}

ModuleStateLocks& ModuleStateLocks::operator=(ModuleStateLocks&& other) noexcept {
  if (this != &other) {
    release();
    keys_ = std::move(other.keys_);
    other.keys_.clear();
  }
  return *this;
}

void ModuleStateLocks::release() {
  if (keys_.empty()) return;
  KeyTable& table = key_table();
  bool freed = false;
  {
    std::lock_guard lock(table.mutex);
    for (const void* key : keys_) {
      auto it = table.held.find(key);
      if (--it->second.scopes > 0) continue;
      table.held.erase(it);
      held_by_this_thread.erase(
          std::find(held_by_this_thread.begin(), held_by_this_thread.end(), key));
      freed = true;
    }
  }
  keys_.clear();
  if (freed) table.released.notify_all();
}

}  // namespace recompose::detail
