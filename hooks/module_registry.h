// The side table that gives LibTorch modules what they lack: per-instance hooks and attached
// state. Keyed by module address; each entry keeps a weak_ptr to its module so that an entry left
// behind by a destroyed module is never mistaken for a new module at the same address, and is
// purged (hooks and states destroyed) at the next registry operation (see module_lifetime.h).
#pragma once

#include <recompose/hooks/forward_annotation.h>  // HookList
#include <recompose/hooks/forward_hooks.h>

#include <atomic>
#include <memory>
#include <shared_mutex>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace recompose::hooks::detail {

struct HookRecord {
  ForwardHook fn;
  HookOptions options;
  bool is_pre = false;
  const torch::nn::Module* module = nullptr;
  std::atomic<bool> removed{false};
};

// HookList: forward_annotation.h (a call's plan holds two).

struct AttachedState {
  std::string api;
  std::shared_ptr<void> state;
  std::type_index type;
};

struct ModuleEntry {
  std::weak_ptr<torch::nn::Module> owner;
  // Copy-on-write: a forward in flight iterates a snapshot while registration replaces the list.
  std::shared_ptr<const HookList> pre = std::make_shared<const HookList>();
  std::shared_ptr<const HookList> post = std::make_shared<const HookList>();
  std::vector<AttachedState> states;

  bool has_hooks() const { return !pre->empty() || !post->empty(); }
};

// What a purge took out of the table. Its owner destroys it after releasing the registry lock:
// the destructors of states and of hooks' callables are user code and may call the registry.
struct ExpiredEntries {
  std::vector<ModuleEntry> entries;
};

class ModuleRegistry {
 public:
  static ModuleRegistry& instance();

  // The live entry of `module`, created if needed (exclusive lock must be held). A dead module's
  // entry at the same address is moved to `dead`, never reused.
  ModuleEntry& entry_for_write(torch::nn::Module& module, ExpiredEntries& dead);
  // The live entry of `module`, or nullptr (shared lock must be held).
  const ModuleEntry* find(const torch::nn::Module& module) const;
  ModuleEntry* find_mutable(const torch::nn::Module& module);
  // Erases `module`'s entry if it holds no hook and no state (exclusive lock must be held).
  void erase_if_empty(const torch::nn::Module& module);

  // Moves every entry of a destroyed module to `dead` (exclusive lock must be held).
  void take_expired(ExpiredEntries& dead);
  // Purges the entries of destroyed modules; takes the lock itself. Returns how many.
  std::size_t purge_expired();
  // From the forward gate: purge_expired() once every kForwardPurgePeriod calls on this thread.
  void purge_expired_amortized();

  std::shared_mutex& mutex() { return mutex_; }
  // Count of modules that have at least one hook: lets the no-hook path skip the lookup.
  std::atomic<long>& hooked_modules() { return hooked_modules_; }
  // Count of entries: with none, a forward neither looks up nor purges.
  std::size_t entry_count() const { return entry_count_.load(std::memory_order_acquire); }

 private:
  std::shared_mutex mutex_;
  std::unordered_map<const torch::nn::Module*, ModuleEntry> entries_;
  std::atomic<long> hooked_modules_{0};
  std::atomic<std::size_t> entry_count_{0};  // entries_.size(), readable without the lock
};

// Throws std::invalid_argument unless `module` is owned by a std::shared_ptr.
std::shared_ptr<torch::nn::Module> require_shared_owner(torch::nn::Module& module,
                                                        const char* what);

}  // namespace recompose::hooks::detail
