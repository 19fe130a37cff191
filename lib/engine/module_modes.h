// The train/eval modes of module trees, recorded and put back: one rule for the recomputation's
// snapshot (module_state_snapshot.h) and the tools' guard (model_state_guard.h).
//
// Modules are recorded parents first (pre-order), each once, as a module may sit under two
// parents or two roots. train(bool) recurses into the children, so putting modes back sets them
// in that order, and a second pass settles a child that a later parent's train() overwrote.
#pragma once

#include "engine/seen_once.h"

#include <c10/util/SmallVector.h>

#include <memory>
#include <utility>

namespace torch::nn {
class Module;
}

namespace recompose::detail {

class ModuleModes {
 public:
  // Records `root` and its descendants, parents first, each module once.
  void add_tree(const std::shared_ptr<torch::nn::Module>& root);
  // The same for a root the caller owns however it likes (not held here; it must outlive this).
  void add_tree(torch::nn::Module& root);

  // Whether any recorded module's mode is not the recorded one now.
  bool changed() const;
  // The same modules, with their modes as they are now.
  ModuleModes current() const;
  // Sets every recorded module to its recorded mode (parents first; only where it differs).
  void put_back() const;

  bool empty() const { return modes_.empty(); }
  std::size_t size() const { return modes_.size(); }
  template <class F>
  void for_each_module(const F& f) const {
    for (const auto& [module, training] : modes_) f(*module);
  }

 private:
  bool add(const std::shared_ptr<torch::nn::Module>& module);
  // Small regions keep it inline: the snapshot lives in the frame and then allocates nothing.
  c10::SmallVector<std::pair<std::shared_ptr<torch::nn::Module>, bool>, 4> modes_;
  SeenOnce<const torch::nn::Module*> seen_;
};

}  // namespace recompose::detail
