// The module registry: entries created on first use, purged when their module is gone.
#include "module_registry.h"

#include <recompose/hooks/module_lifetime.h>

#include <torch/nn/module.h>

#include <c10/util/Type.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace recompose::hooks::detail {

ModuleRegistry& ModuleRegistry::instance() {
  // Leaked on purpose: modules (and their hooks) may outlive static destruction.
  static auto* registry = new ModuleRegistry();
  return *registry;
}

namespace {

// Moves a dead module's entry to `dead`: its records are marked removed. They die with the
// entry's lists (a HookHandle holds its record weakly), or with the last forward still running
// over a snapshot of them: their callables are never written here, where a forward on another
// thread may have called them with no lock ordering the two.
void retire(ModuleEntry&& entry, ExpiredEntries& dead, std::atomic<long>& hooked_modules) {
  if (entry.has_hooks()) hooked_modules.fetch_sub(1);
  for (const auto* list : {entry.pre.get(), entry.post.get()}) {
    for (const auto& record : *list) record->removed.store(true);
  }
  dead.entries.push_back(std::move(entry));
}

}  // namespace

ModuleEntry& ModuleRegistry::entry_for_write(torch::nn::Module& module, ExpiredEntries& dead) {
  auto it = entries_.find(&module);
  if (it != entries_.end() && it->second.owner.expired()) {
    // A module that died with hooks or state; this is a new module at the same address.
    retire(std::move(it->second), dead, hooked_modules_);
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    ModuleEntry fresh;
    fresh.owner = require_shared_owner(module, "attach hooks or state to");
    it = entries_.emplace(&module, std::move(fresh)).first;
  }
  entry_count_.store(entries_.size(), std::memory_order_release);
  return it->second;
}

void ModuleRegistry::erase_if_empty(const torch::nn::Module& module) {
  auto it = entries_.find(&module);
  if (it == entries_.end() || it->second.has_hooks() || !it->second.states.empty()) return;
  entries_.erase(it);  // holds nothing of the user's: safe to destroy under the lock
  entry_count_.store(entries_.size(), std::memory_order_release);
}

void ModuleRegistry::take_expired(ExpiredEntries& dead) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!it->second.owner.expired()) {
      ++it;
      continue;
    }
    retire(std::move(it->second), dead, hooked_modules_);
    it = entries_.erase(it);
  }
  entry_count_.store(entries_.size(), std::memory_order_release);
}

std::size_t ModuleRegistry::purge_expired() {
  if (entry_count() == 0) return 0;
  {
    // Usually nothing died: a read-only pass that does not block forwards on other threads.
    std::shared_lock lock(mutex_);
    if (std::none_of(entries_.begin(), entries_.end(),
                     [](const auto& e) { return e.second.owner.expired(); })) {
      return 0;
    }
  }
  ExpiredEntries dead;  // declared first: destroyed after the lock is released
  std::unique_lock lock(mutex_);
  take_expired(dead);
  return dead.entries.size();
}

void ModuleRegistry::purge_expired_amortized() {
  thread_local unsigned forwards = 0;
  if (++forwards < kForwardPurgePeriod) return;
  forwards = 0;
  purge_expired();
}

const ModuleEntry* ModuleRegistry::find(const torch::nn::Module& module) const {
  auto it = entries_.find(&module);
  if (it == entries_.end() || it->second.owner.expired()) return nullptr;
  return &it->second;
}

ModuleEntry* ModuleRegistry::find_mutable(const torch::nn::Module& module) {
  auto it = entries_.find(&module);
  if (it == entries_.end() || it->second.owner.expired()) return nullptr;
  return &it->second;
}

std::shared_ptr<torch::nn::Module> require_shared_owner(torch::nn::Module& module,
                                                        const char* what) {
  std::shared_ptr<torch::nn::Module> owner = module.weak_from_this().lock();
  if (!owner) {
    throw std::invalid_argument(std::string("recompose: cannot ") + what + " a " +
                                c10::demangle(typeid(module).name()) +
                                " that is not owned by a std::shared_ptr; create it through its "
                                "ModuleHolder (TORCH_MODULE) or std::make_shared");
  }
  return owner;
}

std::shared_ptr<torch::nn::Module> keep_alive(torch::nn::Module& module) {
  return require_shared_owner(module, "store a call of");
}

}  // namespace recompose::hooks::detail
