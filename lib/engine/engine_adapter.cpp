// Adapter: the one place that touches LibTorch's autograd-engine internals.
//
// LibTorch asks Engine::get_default_engine().get_default_saved_variable_hooks() for hooks each
// time it saves a tensor for backward; the base engine says "none", only Python's engine
// overrides it. recompose subclasses the engine (the intended route: the Python engine does the
// same) and installs it with set_default_engine_stub, so saved-tensor hooks work in pure C++.
#include "engine/current_graph_task.h"
#include "engine/saved_tensor_policy.h"
#include "engine/torch_version_guard.h"

#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/engine/engine_adapter.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check torch/csrc/autograd/engine.h (Engine's virtuals \
get_default_saved_variable_hooks and execute_with_graph_task, set_default_engine_stub, \
get_base_engine) and graph_task.h (GraphTask::id_, get_current_graph_task_id), then extend \
torch_version_guard.h"
#endif

#include <recompose/checkpoint_error.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// Internals used: Engine::get_default_saved_variable_hooks and execute_with_graph_task (virtual),
// GraphTask::id_, set_default_engine_stub, get_base_engine, get_current_graph_task_id.

namespace recompose::detail {
namespace {

// How LibTorch holds autograd nodes: std::shared_ptr up to 2.12, c10::intrusive_ptr from 2.13.
using NodePtr = decltype(torch::autograd::Edge::function);

class RecomposeEngine final : public torch::autograd::Engine {
 public:
  RecomposeEngine() = default;
  ~RecomposeEngine() override { stop(); }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    return hooks_for_saved_tensor();
  }

  // Every backward call passes here, on the thread that made it: where a GraphExecGroup learns
  // its graph tasks.
  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(
      const std::shared_ptr<torch::autograd::GraphTask>& graph_task, NodePtr graph_root,
      torch::autograd::InputBuffer&& input_buffer) override {
    note_graph_task_started(static_cast<int64_t>(graph_task->id_));
    return Engine::execute_with_graph_task(graph_task, std::move(graph_root),
                                           std::move(input_buffer));
  }
};

torch::autograd::Engine& recompose_engine() {
  // Leaked on purpose: autograd worker threads may still use it during static destruction.
  static auto* engine = new RecomposeEngine();
  return *engine;
}

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

int64_t current_graph_task_id() { return torch::autograd::get_current_graph_task_id(); }

void ensure_engine_installed() {
  install();
  if (!installed || &torch::autograd::Engine::get_default_engine() != &recompose_engine()) {
    throw CheckpointError(
        "recompose: another autograd engine is LibTorch's default engine (is libtorch_python "
        "loaded "
        "in this process?). recompose needs its own engine for saved-tensor hooks and cannot share "
        "a process with PyTorch's Python engine");
  }
}

struct PolicyStack {
  struct Entry {
    SavedTensorPolicy* policy;  // nullptr: a barrier, policies below it are hidden
    uint64_t id;
    const char* name;
  };
  // Locked by the owning thread at every saved tensor, and by a scope closing on another thread.
  // Recursive: a policy's make_hooks may save tensors itself.
  std::recursive_mutex mutex;
  std::vector<Entry> entries;
  uint64_t next_id = 0;
  std::string misuse;  // reported by the next call on the owning thread
};

namespace {

thread_local std::shared_ptr<PolicyStack> tl_stack;

PolicyStack& this_thread_stack() {
  if (!tl_stack) tl_stack = std::make_shared<PolicyStack>();
  return *tl_stack;
}

// Throws the pending misuse once. Called with the stack locked.
void report_misuse(PolicyStack& stack) {
  if (stack.misuse.empty()) return;
  throw CheckpointError(std::exchange(stack.misuse, std::string()));
}

uint64_t push(PolicyStack& stack, SavedTensorPolicy* policy, const char* name) {
  std::lock_guard lock(stack.mutex);
  report_misuse(stack);
  stack.entries.push_back({policy, stack.next_id, name});
  return stack.next_id++;
}

// Takes entry `id` off `stack` wherever it is (LIFO or not, on any thread), noting a misuse.
void pop(PolicyStack& stack, uint64_t id) noexcept {
  std::lock_guard lock(stack.mutex);
  auto it = std::find_if(stack.entries.begin(), stack.entries.end(),
                         [&](const auto& e) { return e.id == id; });
  if (it == stack.entries.end()) return;
  std::string problem;
  if (&stack != tl_stack.get()) {  // not this thread's stack (thread ids may be reused)
    problem =
        std::string("recompose: ") + it->name +
        " opened on this thread was closed on another thread. A saved-tensor scope "
        "(AsyncSaveOnCpu, SavedTensorMeter, a checkpointed region) must be closed on the thread "
        "that opened it. It has been closed here all the same: tensors saved on this thread no "
        "longer go through it.";
  } else if (std::next(it) != stack.entries.end()) {
    problem =
        std::string("recompose: ") + it->name + " was closed out of order, while " +
        stack.entries.back().name +
        ", opened after it on the same thread, was still open. Saved-tensor scopes "
        "(AsyncSaveOnCpu, SavedTensorMeter, checkpointed regions) must be closed in the reverse "
        "order of opening (LIFO): close the inner one first. The scope has been closed all the "
        "same; the scopes opened after it are still in effect.";
  }
  stack.entries.erase(it);
  // The first misuse is the one to fix; later ones are often its consequences.
  if (!problem.empty() && stack.misuse.empty()) stack.misuse = std::move(problem);
}

}  // namespace

SavedTensorPolicyScope::SavedTensorPolicyScope(SavedTensorPolicy& policy, const char* name,
                                               std::shared_ptr<const void> keep_alive) {
  ensure_engine_installed();
  PolicyStack& stack = this_thread_stack();
  id_ = push(stack, &policy, name);
  stack_ = tl_stack;
  keep_alive_ = std::move(keep_alive);
}
SavedTensorPolicyScope::~SavedTensorPolicyScope() { pop(*stack_, id_); }

SavedTensorPolicyBarrier::SavedTensorPolicyBarrier() {
  PolicyStack& stack = this_thread_stack();
  id_ = push(stack, nullptr, "a checkpointed region's recomputation");
  stack_ = tl_stack;
}
SavedTensorPolicyBarrier::~SavedTensorPolicyBarrier() { pop(*stack_, id_); }

std::unique_ptr<torch::autograd::SavedVariableHooks> hooks_for_saved_tensor() {
  PolicyStack* stack = tl_stack.get();
  if (stack == nullptr) return nullptr;  // no recompose scope was ever opened on this thread
  std::lock_guard lock(stack->mutex);
  report_misuse(*stack);
  for (auto it = stack->entries.rbegin(); it != stack->entries.rend(); ++it) {
    if (it->policy == nullptr) return nullptr;
    if (auto hooks = it->policy->make_hooks()) return hooks;
  }
  return nullptr;
}

void for_each_policy(const std::function<void(SavedTensorPolicy&)>& f) {
  PolicyStack* stack = tl_stack.get();
  if (stack == nullptr) return;
  std::lock_guard lock(stack->mutex);
  for (auto it = stack->entries.rbegin(); it != stack->entries.rend(); ++it) {
    if (it->policy != nullptr) f(*it->policy);
  }
}

}  // namespace recompose::detail
