// Composable activation offload: a pre-hook installs the call's batch as the saved-tensor policy,
// the post-hook takes it off and hands the batch over to be launched when the next offloaded
// call begins.
#include "engine/checkpoint_depth.h"
#include "engine/format_bytes.h"
#include "events/events.h"
#include "swap/never_stall_plan.h"
#include "swap/offload_batch.h"
#include "swap/swap_access.h"
#include "swap/swap_core.h"

#include <recompose/apply_offload.h>
#include <recompose/hooks/composable_api.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

namespace recompose {
namespace {

struct OffloadState {
  OffloadOptions options;
  std::shared_ptr<SwapManager> manager;
  std::shared_ptr<detail::OffloadCounters> counters = std::make_shared<detail::OffloadCounters>();
  // Never-stall mode: what the module's calls move, per shape of what they save.
  std::unique_ptr<detail::NeverStallPlan> plan;
  std::atomic<bool> warned_moves_nothing{false};
};

// An offload that moves nothing is almost always a min_bytes the activations are under (issue 31:
// a Llama layer's 0.25-0.7 MiB activations against the 1 MiB default): said once per module.
void warn_if_moves_nothing(OffloadState& st, const detail::OffloadBatch& batch,
                           const torch::nn::Module& module) {
  if (!batch.moves_nothing() || st.warned_moves_nothing.exchange(true)) return;
  TORCH_WARN("recompose: apply_offload: a call of ", module.name(), " moved none of the ",
             batch.ineligible_activations(), " activations it saved (",
             detail::format_bytes(batch.ineligible_activation_bytes()),
             ") to host memory: each is below SwapOptions::min_bytes (",
             detail::format_bytes(st.manager->options().min_bytes()),
             ") or cannot be offloaded (a slice of a larger tensor, not strided). They stay on "
             "the device, counted as kept in offload_report() and by SavedTensorMeter. Lower "
             "min_bytes (SwapOptions().min_bytes(0) offloads every eligible tensor) or do not "
             "offload this module.");
}

// LibTorch's own modules cannot carry RECOMPOSE_FORWARD: the scopes of recompose/swap.h do the
// same around their call.
std::string builtin_module_advice(const torch::nn::Module&) {
  return "Offload what its call saves with the scopes apply_offload uses, around the call: { "
         "recompose::AsyncSaveOnCpu offload(manager); recompose::SwapGroupScope group(*manager); "
         "y = layer->forward(x); } (see docs/guide/modules-you-cannot-annotate.md)";
}

const hooks::ComposableApi<OffloadState>& offload_api() {
  static const hooks::ComposableApi<OffloadState> api(kOffloadApi, "recompose::apply_offload",
                                                      builtin_module_advice);
  return api;
}

// What one call keeps from its pre-hook to its post-hook.
struct CallOffload {
  // The events' tag of the call (null when no sink listens); its forward is this call's while
  // the scope lives.
  events::Tag region;
  std::optional<events::ForwardScope> region_scope;
  std::shared_ptr<detail::OffloadBatch> batch;
  std::unique_ptr<detail::SavedTensorPolicyScope> scope;
  bool keep_last_on_device = true;
  std::chrono::steady_clock::time_point start =
      std::chrono::steady_clock::now();  // never-stall's measured window
};

// Never-stall mode: the windows of a call that took `forward_seconds`.
std::optional<detail::CopyWindow> window_of(const OffloadOptions& options, double forward_seconds) {
  if (!options.never_stall()) return std::nullopt;
  const double forward =
      options.forward_window_seconds() > 0 ? options.forward_window_seconds() : forward_seconds;
  const double backward =
      options.backward_window_seconds() > 0 ? options.backward_window_seconds() : 2 * forward;
  return detail::CopyWindow{*options.never_stall(), forward, backward};
}

// Offloading does nothing where nothing is kept for backward (grad mode off), where a region
// already keeps nothing (inside a checkpointed forward), and during a recomputation (its tensors
// live until backward uses them, moments later).
bool offload_applies() {
  return torch::autograd::GradMode::is_enabled() && detail::CheckpointDepth::forward() == 0 &&
         detail::CheckpointDepth::recompute() == 0;
}

}  // namespace

torch::nn::Module& apply_offload(torch::nn::Module& module, const OffloadOptions& options) {
  if (options.never_stall() && !options.never_stall()->valid()) {
    throw std::invalid_argument(
        "apply_offload: OffloadOptions::never_stall needs a link with positive, finite "
        "bandwidths both ways and a non-negative cost per copy");
  }
  if (options.forward_window_seconds() < 0 || options.backward_window_seconds() < 0) {
    throw std::invalid_argument("apply_offload: copy windows cannot be negative (0 measures them)");
  }
  if (options.warmup_calls() < 1) {
    throw std::invalid_argument(
        "apply_offload: OffloadOptions::warmup_calls must be at least 1 (the calls whose windows "
        "the never-stall offload measures before it fixes what it moves)");
  }
  auto state = std::make_shared<OffloadState>();
  state->options = options;
  if (options.never_stall())
    state->plan = std::make_unique<detail::NeverStallPlan>(options.warmup_calls());
  state->manager = options.manager() ? options.manager() : SwapManager::default_manager();
  offload_api().apply(
      module, std::move(state), [](hooks::ApiHooks& hooks, std::weak_ptr<OffloadState> weak) {
        // Prepended pre-hook and appended post-hook: the offload encloses every other hook of the
        // module, a checkpointed region in particular (whose inputs it then offloads), whichever
        // was applied first.
        hooks.pre(
            [weak](hooks::ForwardCall& call) {
              auto st = weak.lock();
              if (!st || !offload_applies()) return;
              detail::launch_closed_batches();  // the previous calls' tensors leave as this one
                                                // starts
              auto c = std::make_shared<CallOffload>();
              if (events::listening()) {
                c->region = events::region_begun(
                    {.kind = events::RegionKind::OffloadCall, .module = &call.module()});
                if (c->region) c->region_scope.emplace(c->region);
              }
              c->keep_last_on_device = st->options.keep_last_on_device();
              c->batch = std::make_shared<detail::OffloadBatch>(
                  detail::SwapAccess::core(*st->manager), st->counters, st->options.policy());
              c->scope = std::make_unique<detail::SavedTensorPolicyScope>(
                  c->batch->policy(), "recompose::apply_offload", c->batch);
              st->counters->calls += 1;
              call.slot(kOffloadApi) = c;
            },
            hooks::HookOptions().prepend(true));
        hooks.post(
            [weak](hooks::ForwardCall& call) {
              auto c = std::static_pointer_cast<CallOffload>(call.slot(kOffloadApi));
              if (!c) return;
              call.slot(kOffloadApi).reset();
              c->scope.reset();
              c->region_scope.reset();
              // The call ends after the launch below: what stays (keep_last_on_device(false)).
              struct EndCall {
                events::Tag region;
                ~EndCall() {
                  // A destructor, possibly during unwinding: a sink that cannot record the end
                  // (out of memory) leaves it unrecorded, rather than end the program.
                  try {
                    if (region) events::forward_ended(*region, nullptr);
                  } catch (...) {  // NOLINT(bugprone-empty-catch)
                  }
                }
              } end_call{c->region};
              if (call.error())
                return;  // the forward failed: its graph, and the tensors, are dropped
              if (auto st = weak.lock()) {
                warn_if_moves_nothing(*st, *c->batch, call.module());
                const double took =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - c->start)
                        .count();
                if (auto window = window_of(st->options, took)) {
                  // See Note [ Never-stall offload decides once ].
                  auto choice = st->plan->choose(c->batch->saved_bytes(), *window);
                  if (!choice.moves) st->counters->warmup_calls += 1;
                  if (choice.decided_now) st->counters->decisions += 1;
                  c->batch->limit_to(*window, std::move(choice.moves));
                }
              }
              if (c->keep_last_on_device) {
                detail::add_closed_batch(std::move(c->batch));
              } else {
                c->batch->launch();
              }
            },
            hooks::HookOptions().always_call(true));
      });
  return module;
}

namespace detail {
int64_t apply_offload_where(torch::nn::Module& model,
                            const std::function<bool(const torch::nn::Module&)>& match,
                            const std::string& type_name, const OffloadOptions& options) {
  return hooks::apply_to_matching(
      model, "apply_offload_to", type_name, match,
      [&](torch::nn::Module& m) { apply_offload(m, options); },
      [](torch::nn::Module& m) { remove_offload(m); });
}
}  // namespace detail

bool remove_offload(torch::nn::Module& module) { return offload_api().remove(module); }

bool is_offloaded(const torch::nn::Module& module) { return offload_api().is_applied(module); }

OffloadStats offload_stats(const torch::nn::Module& module) {
  detail::check_landings();
  return offload_api().state_or_throw(module, "recompose::offload_stats")->counters->snapshot();
}

void reset_offload_stats(torch::nn::Module& module) {
  offload_api().state_or_throw(module, "recompose::reset_offload_stats")->counters->reset();
}

}  // namespace recompose
