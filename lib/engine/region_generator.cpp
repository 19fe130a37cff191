// The non-reentrant checkpoint protocol of one region invocation, as a C++20 coroutine (like
// PyTorch's _checkpoint_without_reentrant_generator): the pre-forward step runs when the region
// begins, the coroutine suspends while the body runs, and the post-forward step runs when it is
// resumed with the body's outcome. The RAII scopes it holds across the suspension (the region's
// saved-tensor policy, the forward context, the debug trace) are therefore exactly as long as
// the body.
#include "engine/checkpoint_depth.h"
#include "engine/enclosing_region.h"
#include "engine/frame.h"
#include "engine/op_trace.h"
#include "engine/region_events.h"
#include "engine/region_forward_policy.h"
#include "engine/region_inputs.h"
#include "engine/region_plugin.h"
#include "engine/region_switches.h"
#include "engine/rng_state.h"

#include <recompose/checkpoint_error.h>
#include <recompose/region_run.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <coroutine>
#include <optional>

namespace recompose::detail {
namespace {

class RegionCoroutine {
 public:
  struct promise_type {
    std::exception_ptr body_error;
    std::exception_ptr step_error;
    bool region_active = false;
    RegionCoroutine get_return_object() {
      return RegionCoroutine(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_never initial_suspend() noexcept { return {}; }  // run the pre-forward step now
    std::suspend_always final_suspend() noexcept { return {}; }   // keep the frame for inspection
    void return_void() noexcept {}
    void unhandled_exception() noexcept { step_error = std::current_exception(); }
  };

  // co_await BodyRuns{}: suspends while the body runs; evaluates to the body's exception.
  struct BodyRuns {
    promise_type* promise = nullptr;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<promise_type> h) noexcept { promise = &h.promise(); }
    std::exception_ptr await_resume() const noexcept { return promise->body_error; }
  };

  explicit RegionCoroutine(std::coroutine_handle<promise_type> h) : handle_(h) {}
  RegionCoroutine(RegionCoroutine&& o) noexcept : handle_(std::exchange(o.handle_, {})) {}
  RegionCoroutine& operator=(RegionCoroutine&&) = delete;
  ~RegionCoroutine() {
    // Destroying a suspended coroutine unwinds the scopes it holds (LIFO with the caller's).
    if (handle_) handle_.destroy();
  }
  std::coroutine_handle<promise_type> handle() const { return handle_; }

 private:
  std::coroutine_handle<promise_type> handle_;
};

std::shared_ptr<RegionContexts> make_contexts(const CheckpointOptions& options) {
  validate_options(options);
  if (options.context_fn()) return options.context_fn()();
  for (const auto& plugin : region_plugins()) {
    if (auto contexts = plugin->contexts(options)) return contexts;
  }
  return nullptr;
}

// Scopes and tokens of the plug-ins, closed in reverse order of opening.
template <class T>
class LifoList {
 public:
  LifoList() = default;
  LifoList(const LifoList&) = delete;
  LifoList& operator=(const LifoList&) = delete;
  ~LifoList() {
    while (!items_.empty()) items_.pop_back();
  }
  void push(T item) {
    if (item) items_.push_back(std::move(item));
  }

 private:
  std::vector<T> items_;
};

// The frame whose forward runs on this thread (innermost), or nullptr.
thread_local Frame* t_forward_frame = nullptr;

}  // namespace

bool enclosing_region_reruns_its_forward() {
  return t_forward_frame != nullptr && t_forward_frame->replay() == nullptr &&
         CheckpointDepth::recompute() == 0;
}

namespace {

// Makes `frame` the innermost forward of this thread while alive; tells the enclosing one that
// a region began inside it.
class ForwardFrameScope {
 public:
  explicit ForwardFrameScope(Frame* frame) : outer_(t_forward_frame) {
    if (outer_ != nullptr) outer_->mark_contains_region();
    t_forward_frame = frame;
  }
  ~ForwardFrameScope() { t_forward_frame = outer_; }
  ForwardFrameScope(const ForwardFrameScope&) = delete;
  ForwardFrameScope& operator=(const ForwardFrameScope&) = delete;

 private:
  Frame* outer_;
};

// `options` and `inputs` are references: RegionRun::begin runs the pre-forward step before it
// returns, and the post-forward step reads only what the pre-forward step copied into locals
// (copying the options and the inputs into the coroutine frame cost more than the rest of it).
RegionCoroutine region_protocol(const CheckpointOptions& options,
                                const std::vector<at::Tensor>& inputs, RecomputeFn recompute,
                                std::shared_ptr<torch::nn::Module> owner) {
  // ---- pre-forward step ----
  const bool early_stop = early_stop_override().value_or(options.early_stop());
  const bool debug = debug_override().value_or(options.debug());
  const bool preserve_rng = options.preserve_rng_state();
  auto frame =
      std::make_shared<Frame>(std::move(recompute), early_stop, options.determinism_check(), debug);
  frame->set_forward_state(capture_forward_state(inputs, preserve_rng));
  if (options.preserve_module_state() && (owner || !options.state_modules().empty())) {
    frame->snapshot_module_state(options.state_modules(), owner);
  }
  // The region's tag for the sinks listening (null when none); the meters' charges of the
  // inputs and the body go to it.
  events::Tag tag;
  std::optional<events::ForwardScope> tag_scope;
  if (events::listening()) {
    tag = events::region_begun(region_begun_event(options, owner.get()));
    tag_scope.emplace(tag);
    frame->set_events_tag(tag);
  }
  {
    // The plug-ins' saved-tensor policies for the inputs (swap_inputs).
    LifoList<std::unique_ptr<SavedTensorPolicyScope>> input_scopes;
    for (const auto& plugin : region_plugins()) input_scopes.push(plugin->input_policy(options));
    if (tag) events::inputs_saved(*tag, how_inputs_are_saved(), inputs);
    frame->set_inputs(save_region_inputs(inputs));
  }
  frame->set_contexts(make_contexts(options));
  if (auto* replay = frame->replay()) replay->region_inputs(inputs);
  LifoList<std::shared_ptr<void>> plugin_tokens;  // held until the post-forward step has run
  for (const auto& plugin : region_plugins()) plugin_tokens.push(plugin->begin_region(options));

  RegionForwardPolicy policy(frame);
  SavedTensorPolicyScope scope(policy);
  std::shared_ptr<void> context = frame->contexts() ? frame->contexts()->enter_forward() : nullptr;
  DepthGuard depth(CheckpointDepth::forward());
  ForwardFrameScope innermost(frame.get());
  std::optional<OpTrace> trace;
  if (debug) trace.emplace(frame->forward_ops());

  std::exception_ptr body_error = co_await RegionCoroutine::BodyRuns{};

  // ---- post-forward step ----
  if (!body_error) frame->mark_forward_completed();
  if (tag) events::forward_ended(*tag, body_error);
  if (preserve_rng) {
    if (auto device = device_initialised_since(frame->forward_state()); !device.empty())
      frame->set_rng_problem(device);
  }
}

}  // namespace

void validate_options(const CheckpointOptions& options) {
  for (const auto& plugin : region_plugins()) plugin->validate(options);
}

struct RegionRun::State {
  RegionCoroutine coroutine;
  bool ended = false;
};

RegionRun RegionRun::begin(const CheckpointOptions& options,
                           const std::vector<at::Tensor>& input_leaves, RecomputeFn recompute,
                           std::shared_ptr<torch::nn::Module> owner) {
  // No graph will be recorded: no region, the body just runs (as PyTorch does when the input
  // saver has no grad_fn).
  if (!at::GradMode::is_enabled() || c10::InferenceMode::is_enabled()) return RegionRun(nullptr);
  auto state = std::make_shared<State>(
      State{region_protocol(options, input_leaves, std::move(recompute), std::move(owner))});
  auto& promise = state->coroutine.handle().promise();
  if (promise.step_error) std::rethrow_exception(promise.step_error);
  return RegionRun(std::move(state));
}

void RegionRun::end(std::exception_ptr body_error) {
  if (!state_ || state_->ended) return;
  state_->ended = true;
  auto handle = state_->coroutine.handle();
  handle.promise().body_error = body_error;
  handle.resume();
  std::exception_ptr step_error = handle.promise().step_error;
  state_.reset();  // destroys the finished coroutine
  if (step_error && !body_error) std::rethrow_exception(step_error);
}

RegionRun::~RegionRun() {
  // A region abandoned without end() (the body's caller unwound past it): destroying the
  // suspended coroutine pops its scopes.
  state_.reset();
}

}  // namespace recompose::detail
