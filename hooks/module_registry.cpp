#include "module_registry.h"

#include <torch/nn/module.h>

#include <c10/util/Type.h>

#include <stdexcept>

namespace recompose::hooks::detail {

ModuleRegistry& ModuleRegistry::instance() {
  // Leaked on purpose: modules (and their hooks) may outlive static destruction.
  static auto* registry = new ModuleRegistry();
  return *registry;
}

ModuleEntry& ModuleRegistry::entry_for_write(torch::nn::Module& module) {
  auto it = entries_.find(&module);
  if (it != entries_.end() && it->second.owner.expired()) {
    // A module that died with hooks or state; this is a new module at the same address.
    if (!it->second.pre->empty() || !it->second.post->empty()) hooked_modules_.fetch_sub(1);
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    ModuleEntry fresh;
    fresh.owner = require_shared_owner(module, "attach hooks or state to");
    it = entries_.emplace(&module, std::move(fresh)).first;
  }
  return it->second;
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

std::shared_ptr<torch::nn::Module> require_shared_owner(torch::nn::Module& module, const char* what) {
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
