#include "engine/module_modes.h"

#include <torch/nn/module.h>

#include <algorithm>

namespace recompose::detail {

bool ModuleModes::add(const std::shared_ptr<torch::nn::Module>& module) {
  if (!seen_.insert(module.get())) return false;
  modes_.emplace_back(module, module->is_training());
  return true;
}

void ModuleModes::add_tree(const std::shared_ptr<torch::nn::Module>& root) {
  if (!add(root)) return;  // its subtree was recorded with it
  for (const auto& child : root->children()) add_tree(child);
}

void ModuleModes::add_tree(torch::nn::Module& root) {
  // Not owned here (the aliasing constructor with no owner): a module on the user's stack works.
  add_tree(std::shared_ptr<torch::nn::Module>(std::shared_ptr<void>(), &root));
}

bool ModuleModes::changed() const {
  return std::any_of(modes_.begin(), modes_.end(),
                     [](const auto& entry) { return entry.first->is_training() != entry.second; });
}

ModuleModes ModuleModes::current() const {
  ModuleModes now;
  for (const auto& [module, training] : modes_) {
    now.modes_.emplace_back(module, module->is_training());
    now.seen_.insert(module.get());
  }
  return now;
}

void ModuleModes::put_back() const {
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [module, training] : modes_) {
      if (module->is_training() != training) module->train(training);
    }
  }
}

}  // namespace recompose::detail
