// What happens to a tensor that autograd saves for backward, decided per thread.
//
// LibTorch asks its default autograd engine for "default saved-variable hooks" every time a
// SavedVariable is made; recompose installs an engine of its own (engine_adapter.cpp) that
// answers from a thread-local stack of SavedTensorPolicy objects. The checkpoint region, the
// recomputation, the meter and activation swap are such policies.
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>

namespace recompose::detail {

class SavedTensorPolicy {
 public:
  virtual ~SavedTensorPolicy() = default;
  // Hooks for one tensor about to be saved, or nullptr to let the next policy down the stack
  // decide (and, at the bottom, to save it as LibTorch does).
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() = 0;
};

// Installs `policy` as the innermost policy of this thread while alive (LIFO). Installs the
// recompose autograd engine on first use. The policy must outlive the scope.
class SavedTensorPolicyScope {
 public:
  explicit SavedTensorPolicyScope(SavedTensorPolicy& policy);
  ~SavedTensorPolicyScope();
  SavedTensorPolicyScope(const SavedTensorPolicyScope&) = delete;
  SavedTensorPolicyScope& operator=(const SavedTensorPolicyScope&) = delete;
};

// Hides every policy of this thread while alive (recomputation starts "as if no checkpoint
// were active": NOTE [ Nestable Checkpoint ], rule 3), then restores them.
class SavedTensorPolicyBarrier {
 public:
  SavedTensorPolicyBarrier();
  ~SavedTensorPolicyBarrier();
  SavedTensorPolicyBarrier(const SavedTensorPolicyBarrier&) = delete;
  SavedTensorPolicyBarrier& operator=(const SavedTensorPolicyBarrier&) = delete;
};

// Makes sure the recompose engine is LibTorch's default autograd engine. Throws CheckpointError
// if another engine (for instance Python's, when libtorch_python is loaded) already is.
void ensure_engine_installed();

// The hooks the policies of this thread give for one tensor (nullptr if none).
std::unique_ptr<torch::autograd::SavedVariableHooks> hooks_for_saved_tensor();

}  // namespace recompose::detail
