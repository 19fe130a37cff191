// The one place that touches LibTorch's autograd-engine internals.
//
// LibTorch asks Engine::get_default_engine().get_default_saved_variable_hooks() for hooks each
// time it saves a tensor for backward; the base engine says "none", only Python's engine
// overrides it. recompose subclasses the engine (the intended route: the Python engine does the
// same) and installs it with set_default_engine_stub, so saved-tensor hooks work in pure C++.
#include "engine/saved_tensor_policy.h"

#include <recompose/checkpoint_error.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/headeronly/version.h>

#include <mutex>
#include <vector>

#if !(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#error "recompose's engine adapter needs LibTorch 2.1 or newer (get_default_saved_variable_hooks, set_default_engine_stub); verified on 2.11"
#endif

namespace recompose::detail {
namespace {

class RecomposeEngine final : public torch::autograd::Engine {
 public:
  RecomposeEngine() = default;
  ~RecomposeEngine() override { stop(); }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    return hooks_for_saved_tensor();
  }
};

torch::autograd::Engine& recompose_engine() {
  // Leaked on purpose: autograd worker threads may still use it during static destruction.
  static auto* engine = new RecomposeEngine();
  return *engine;
}

// nullptr entries are barriers: policies below them are hidden.
thread_local std::vector<SavedTensorPolicy*> tl_policies;

std::once_flag install_once;
bool installed = false;

void install() {
  std::call_once(install_once, [] {
    auto& current = torch::autograd::Engine::get_default_engine();
    // Only replace LibTorch's own base engine; never a foreign one (Python's).
    if (&current == &torch::autograd::Engine::get_base_engine()) {
      torch::autograd::set_default_engine_stub(&recompose_engine);
      installed = true;
    }
  });
}

// Installed when the library is loaded, before any backward can run.
const bool installed_at_load = (install(), true);

}  // namespace

void ensure_engine_installed() {
  install();
  if (!installed || &torch::autograd::Engine::get_default_engine() != &recompose_engine()) {
    throw CheckpointError(
        "recompose: another autograd engine is LibTorch's default engine (is libtorch_python loaded "
        "in this process?). recompose needs its own engine for saved-tensor hooks and cannot share "
        "a process with PyTorch's Python engine");
  }
}

SavedTensorPolicyScope::SavedTensorPolicyScope(SavedTensorPolicy& policy) {
  ensure_engine_installed();
  tl_policies.push_back(&policy);
}
SavedTensorPolicyScope::~SavedTensorPolicyScope() { tl_policies.pop_back(); }

SavedTensorPolicyBarrier::SavedTensorPolicyBarrier() { tl_policies.push_back(nullptr); }
SavedTensorPolicyBarrier::~SavedTensorPolicyBarrier() { tl_policies.pop_back(); }

std::unique_ptr<torch::autograd::SavedVariableHooks> hooks_for_saved_tensor() {
  for (auto it = tl_policies.rbegin(); it != tl_policies.rend(); ++it) {
    if (*it == nullptr) return nullptr;
    if (auto hooks = (*it)->make_hooks()) return hooks;
  }
  return nullptr;
}

}  // namespace recompose::detail
