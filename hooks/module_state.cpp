// Typed state attached to modules by composable APIs.
#include "module_registry.h"

#include <recompose/hooks/module_state.h>

#include <torch/nn/module.h>

#include <c10/util/Type.h>

#include <mutex>

namespace recompose::hooks {
namespace detail {

void attach_state_erased(torch::nn::Module& module, std::string_view api,
                         std::shared_ptr<void> state, std::type_index type) {
  if (api.empty()) throw std::invalid_argument("recompose: an API name must not be empty");
  auto& reg = ModuleRegistry::instance();
  ExpiredEntries dead;  // declared first: destroyed after the lock is released
  std::unique_lock lock(reg.mutex());
  reg.take_expired(dead);
  ModuleEntry& entry = reg.entry_for_write(module, dead);
  for (const auto& s : entry.states) {
    if (s.api == api) {
      throw CompositionError("recompose: " + std::string(api) + " is already applied to this " +
                             c10::demangle(typeid(module).name()) +
                             "; applying the same composable API twice to a module is not allowed");
    }
  }
  entry.states.push_back(AttachedState{std::string(api), std::move(state), type});
}

std::shared_ptr<void> find_state_erased(const torch::nn::Module& module, std::string_view api,
                                        std::type_index type) {
  auto& reg = ModuleRegistry::instance();
  reg.purge_expired();
  std::shared_lock lock(reg.mutex());
  const ModuleEntry* entry = reg.find(module);
  if (entry == nullptr) return nullptr;
  for (const auto& s : entry->states) {
    if (s.api != api) continue;
    if (s.type != type) {
      throw CompositionError("recompose: the state of " + std::string(api) + " has type " +
                             c10::demangle(s.type.name()) + ", not " + c10::demangle(type.name()));
    }
    return s.state;
  }
  return nullptr;
}

}  // namespace detail

bool detach_state(torch::nn::Module& module, std::string_view api) {
  auto& reg = detail::ModuleRegistry::instance();
  // Declared first, so destroyed after the lock is released: a state's destructor is user code.
  detail::ExpiredEntries dead;
  std::shared_ptr<void> detached;
  std::unique_lock lock(reg.mutex());
  reg.take_expired(dead);
  detail::ModuleEntry* entry = reg.find_mutable(module);
  if (entry == nullptr) return false;
  auto& states = entry->states;
  for (auto it = states.begin(); it != states.end(); ++it) {
    if (it->api == api) {
      detached = std::move(it->state);
      states.erase(it);
      reg.erase_if_empty(module);
      return true;
    }
  }
  return false;
}

std::vector<std::string> applied_apis(const torch::nn::Module& module) {
  auto& reg = detail::ModuleRegistry::instance();
  reg.purge_expired();
  std::shared_lock lock(reg.mutex());
  std::vector<std::string> names;
  if (const detail::ModuleEntry* entry = reg.find(module)) {
    for (const auto& s : entry->states) names.push_back(s.api);
  }
  return names;
}

}  // namespace recompose::hooks
