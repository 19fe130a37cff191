// The side table that gives LibTorch modules what they lack: per-instance hooks and attached
// state. Keyed by module address; each entry keeps a weak_ptr to its module so that an entry left
// behind by a destroyed module is never mistaken for a new module at the same address.
#pragma once

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

using HookList = std::vector<std::shared_ptr<HookRecord>>;

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
};

class ModuleRegistry {
 public:
  static ModuleRegistry& instance();

  // The live entry of `module`, created if needed (exclusive lock must be held).
  ModuleEntry& entry_for_write(torch::nn::Module& module);
  // The live entry of `module`, or nullptr (shared lock must be held).
  const ModuleEntry* find(const torch::nn::Module& module) const;
  ModuleEntry* find_mutable(const torch::nn::Module& module);

  std::shared_mutex& mutex() { return mutex_; }
  // Count of modules that have at least one hook: lets the no-hook path skip the lookup.
  std::atomic<long>& hooked_modules() { return hooked_modules_; }

 private:
  std::shared_mutex mutex_;
  std::unordered_map<const torch::nn::Module*, ModuleEntry> entries_;
  std::atomic<long> hooked_modules_{0};
};

// Throws std::invalid_argument unless `module` is owned by a std::shared_ptr.
std::shared_ptr<torch::nn::Module> require_shared_owner(torch::nn::Module& module, const char* what);

}  // namespace recompose::hooks::detail
