// create_selective_checkpoint_contexts: the forward context caches the outputs of saved ops,
// the recompute context replays them (upstream's _CachingTorchDispatchMode and
// _CachedTorchDispatchMode): forward_interceptor.cpp and rerun_interceptor.cpp, sharing one
// SacState (sac_state.h) per region invocation.
// The forward context also records a ForwardTrace, from which the contexts, as the region's
// SavedTensorReplay, rebuild the dropped saved tensors without running the forward again
// (docs/architecture.md, "Selective replay"); the recompute context serves the regions that
// cannot be replayed so.

#include "dispatch_interceptor.h"
#include "engine/enclosing_region.h"
#include "engine/saved_tensor_replay.h"
#include "engine/tensor_accounting.h"
#include "events/events.h"
#include "op_names.h"
#include "replay_executor.h"
#include "replay_stats.h"
#include "sac_state.h"
#include "summarizing_contexts.h"

#include <recompose/checkpoint_error.h>
#include <recompose/selective_checkpoint.h>

#include <memory>
#include <utility>
#include <vector>

namespace recompose {
namespace {

using detail::extra_backward_error;
using detail::KeptOutput;
using detail::SacState;
using detail::warn_about_policy;

// What enter_*() returns: the interceptor installed on this thread while it is alive.
struct Entered {
  enum class Kind { Forward, Recompute };
  Entered(std::shared_ptr<SacState> s, Kind k)
      : state(std::move(s)),
        kind(k),
        interceptor(k == Kind::Forward ? detail::make_forward_interceptor(*state)
                                       : detail::make_rerun_interceptor(*state)),
        scope(*interceptor) {}
  ~Entered() {
    if (kind == Kind::Recompute) {
      state->recompute_active.store(false);
    } else {
      state->version_carried_writes();
      settle_kept_for_replay(*state);
      warn_about_policy(*state);
      if (state->summary_sink) hand_summary(*state);
      if (state->tally.collect_names) {
        std::vector<std::string> asked;
        for (const c10::OperatorHandle& op : state->tally.asked_ops)
          asked.push_back(detail::overload_name(op));
        events::policy_unmatched(detail::unmatched_op_names(state->policy.op_names(), asked));
      }
    }
  }
  // What the region keeps for its replay beyond the policy's outputs (draws, parameter casts
  // within the policy's budget), told to the sinks as kept for the replay. From a destructor: if
  // it cannot be settled (out of host memory), nothing is kept and the replay draws and casts.
  static void settle_kept_for_replay(SacState& s) noexcept {
    try {
      const detail::KeptForReplay kept =
          s.trace.settle_kept_for_replay(s.policy.parameter_cast_budget());
      if (const events::Tag tag = events::forward_tag()) {
        for (const int64_t b : kept.casts)
          events::kept(*tag, events::KeptReason::ParameterCastForReplay, b);
        for (const int64_t b : kept.draws) events::kept(*tag, events::KeptReason::DrawForReplay, b);
      }
    } catch (...) {
      s.trace.release_draws();
    }
  }
  // A destructor must not throw: a summary that cannot be made (out of host memory) is handed as
  // failed (an empty one allocates nothing), which its tool reports (summarizing_contexts.h).
  static void hand_summary(SacState& s) noexcept {
    try {
      s.summary_sink(detail::summarize(s.trace));
      return;
    } catch (...) {
    }
    try {
      detail::ForwardSummary failed;
      failed.failed = true;
      s.summary_sink(std::move(failed));
    } catch (...) {
    }
  }
  std::shared_ptr<SacState> state;
  Kind kind;
  std::unique_ptr<detail::OpInterceptor> interceptor;
  detail::InterceptorScope scope;  // declared last: uninstalled first
};

class SelectiveContexts final : public RegionContexts, public detail::SavedTensorReplay {
 public:
  explicit SelectiveContexts(std::shared_ptr<SacState> s) : state_(std::move(s)) {}

  void region_inputs(const std::vector<at::Tensor>& inputs) override {
    state_->trace.add_inputs(inputs);
  }
  void saved(std::size_t index, const at::Tensor& tensor) override {
    state_->trace.saved(index, tensor);
  }
  void not_replayed(const char* why) override {
    state_->trace.release_draws();  // the forward runs again and draws anew
    events::ReplayOutcome outcome;
    outcome.fallback_reason = why;
    detail::count_replay(outcome, 0);
  }

  bool replay(const std::vector<at::Tensor>& inputs, bool rng_preserved,
              const std::vector<bool>& needed, std::vector<at::Tensor>& out) override {
    SacState& s = *state_;
    if (!selective_replay_enabled()) {
      not_replayed("selective replay is off (recompose::set_selective_replay_enabled(false))");
      return false;
    }
    if (!s.trace.recorded_for_replay()) {
      not_replayed(
          "selective replay was off in the region's forward "
          "(recompose::set_selective_replay_enabled(false)): what only a replay reads was not "
          "recorded");
      return false;
    }
    // As a recomputation would: the first kept output it reaches was handed out already.
    if (s.replayed && !s.tally.first_kept_op.empty())
      throw CheckpointError(extra_backward_error(s.tally.first_kept_op));
    // As a recomputation would, which replays every kept output: one modified in place since the
    // forward is an error even where the replay does not need it.
    bool carrier_modified = false;
    s.trace.for_each_kept([&](const c10::OperatorHandle& op, KeptOutput& kept) {
      if (!kept.available()) return;
      if (kept.entry.carries_writes()) {
        carrier_modified = carrier_modified || kept.entry.modified();
      } else {
        kept.entry.check_unmodified(op, kept.call_index, s.allow_cache_entry_mutation);
      }
    });
    if (carrier_modified) {
      not_replayed(
          "a kept output that carried a write of the forward was modified in place since (the "
          "region's output?): the recomputation runs its op again");
      return false;
    }
    RECORD_USER_SCOPE("recompose::selective_replay");  // a span in profiles (gpt --profile)
    const auto start = std::chrono::steady_clock::now();
    auto replay_kept = [&](const c10::OperatorHandle& op, KeptOutput& kept,
                           torch::jit::Stack* values) {
      if (!kept.available()) throw CheckpointError(extra_backward_error(op.schema().name()));
      const bool own = kept.entry.private_copies();  // released below: the replay's alone then
      kept.entry.hand_out(op, kept.call_index, s.allow_cache_entry_mutation, values);
      // One replay per region, as one recomputation: free the kept outputs as backward goes.
      kept.consume();
      return own;
    };
    events::ReplayOutcome outcome =
        detail::rebuild_saved(s.trace, inputs, rng_preserved, needed, replay_kept, out);
    s.trace.release_draws();  // one recomputation per region; a second backward draws again
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start);
    detail::count_replay(outcome, ns.count());
    // A replay that runs never gives up (Note [ The replay's contract ]): a fallback is decided
    // before any kept output is handed out, and the forward run again still finds them all.
    if (!outcome.replayed) return false;
    s.replayed = true;
    s.trace
        .release_kept();  // one replay per region, as one recomputation: free the kept outputs now
    return true;
  }

  std::shared_ptr<void> enter_forward() override {
    if (state_->forward_entered.exchange(true)) {
      throw CheckpointError(
          "recompose: selective checkpoint: the forward context of these contexts was entered a "
          "second "
          "time. create_selective_checkpoint_contexts() makes the contexts of ONE region "
          "invocation; "
          "make new ones for every forward (as a ContextFn does).");
    }
    state_->keeps_nothing_inside_full = detail::enclosing_region_reruns_its_forward();
    state_->trace.record_for_replay(selective_replay_enabled());
    state_->trace.record_summary(static_cast<bool>(state_->summary_sink));
    state_->tally.collect_names = events::listening() && !state_->policy.op_names().empty();
    return std::make_shared<Entered>(state_, Entered::Kind::Forward);
  }

  std::shared_ptr<void> enter_recompute() override {
    if (state_->recompute_active.exchange(true)) {
      throw CheckpointError(
          "recompose: selective checkpoint: the recompute context was entered while a "
          "recomputation of "
          "the same region invocation is still running (concurrent backward passes over one region "
          "are not supported).");
    }
    try {
      state_->trace.restart_calls();
      return std::make_shared<Entered>(state_, Entered::Kind::Recompute);
    } catch (...) {
      state_->recompute_active.store(false);
      throw;
    }
  }

 private:
  std::shared_ptr<SacState> state_;
};

}  // namespace

std::shared_ptr<RegionContexts> create_selective_checkpoint_contexts(
    const SelectivePolicy& policy, bool allow_cache_entry_mutation,
    std::shared_ptr<SwapManager> swap_manager) {
  auto state = std::make_shared<SacState>(policy, allow_cache_entry_mutation);
  state->swap = std::move(swap_manager);
  return std::make_shared<SelectiveContexts>(std::move(state));
}

namespace detail {

std::shared_ptr<RegionContexts> create_summarizing_contexts(const SelectivePolicy& policy,
                                                            bool allow_cache_entry_mutation,
                                                            SummarySink sink) {
  auto state = std::make_shared<SacState>(policy, allow_cache_entry_mutation);
  state->summary_sink = std::move(sink);
  return std::make_shared<SelectiveContexts>(std::move(state));
}

}  // namespace detail
}  // namespace recompose
