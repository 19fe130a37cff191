// What happens to a tensor that autograd saves for backward, decided per thread.
//
// LibTorch asks its default autograd engine for "default saved-variable hooks" every time a
// SavedVariable is made; recompose installs an engine of its own (engine_adapter.cpp) that
// answers from a thread-local stack of SavedTensorPolicy objects. The checkpoint region, the
// recomputation, the meter and activation swap are such policies.
//
// Scopes must close in LIFO order on the thread that opened them. A scope closed out of order,
// or on another thread, is still removed from the stack it was pushed on (nothing dangles, the
// other scopes keep working), and the misuse is reported by the next recompose call on the
// thread that opened it: the next tensor saved there, or the next scope opened there, throws a
// CheckpointError naming it (once; destructors cannot throw). See Note [ Saved-tensor scopes ].
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace recompose::detail {

class SavedTensorPolicy {
 public:
  virtual ~SavedTensorPolicy() = default;
  // Hooks for one tensor about to be saved, or nullptr to let the next policy down the stack
  // decide (and, at the bottom, to save it as LibTorch does).
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() = 0;
};

// One thread's stack of policies (engine_adapter.cpp); shared with the scopes pushed on it, so
// that a scope closed on another thread can still take itself off.
struct PolicyStack;

// Installs `policy` as the innermost policy of this thread while alive. Installs the recompose
// autograd engine on first use. `name` says what opened the scope in misuse reports (a string
// literal). `keep_alive`, if given, is held until the scope closes (the policy's owner). The
// policy must outlive the scope. Throws CheckpointError if a misuse of this thread's scopes is
// pending (see the header comment) or if another autograd engine is installed.
//   SavedTensorPolicyScope scope(policy, "recompose::AsyncSaveOnCpu");
class SavedTensorPolicyScope {
 public:
  explicit SavedTensorPolicyScope(SavedTensorPolicy& policy,
                                  const char* name = "a checkpointed region",
                                  std::shared_ptr<const void> keep_alive = nullptr);
  ~SavedTensorPolicyScope();
  SavedTensorPolicyScope(const SavedTensorPolicyScope&) = delete;
  SavedTensorPolicyScope& operator=(const SavedTensorPolicyScope&) = delete;

 private:
  std::shared_ptr<PolicyStack> stack_;
  uint64_t id_;
  std::shared_ptr<const void> keep_alive_;
};

// Hides every policy of this thread while alive (recomputation starts "as if no checkpoint
// were active": See Note [ Nestable Checkpoint ], rule 3), then restores them. Same rules as a
// scope.
class SavedTensorPolicyBarrier {
 public:
  SavedTensorPolicyBarrier();
  ~SavedTensorPolicyBarrier();
  SavedTensorPolicyBarrier(const SavedTensorPolicyBarrier&) = delete;
  SavedTensorPolicyBarrier& operator=(const SavedTensorPolicyBarrier&) = delete;

 private:
  std::shared_ptr<PolicyStack> stack_;
  uint64_t id_;
};

// Makes sure the recompose engine is LibTorch's default autograd engine. Throws CheckpointError
// if another engine (for instance Python's, when libtorch_python is loaded) already is.
void ensure_engine_installed();

// The hooks the policies of this thread give for one tensor (nullptr if none). Throws
// CheckpointError if a misuse of this thread's scopes is pending.
std::unique_ptr<torch::autograd::SavedVariableHooks> hooks_for_saved_tensor();

// Calls `f` on every policy of this thread, innermost first, barriers ignored. The stack is
// locked meanwhile (a scope closing on another thread waits): `f` must not open or close scopes.
void for_each_policy(const std::function<void(SavedTensorPolicy&)>& f);

}  // namespace recompose::detail
