// The interceptor of a selective region's recomputation when the replay cannot serve it: the
// forward runs again, kept ops answered from the trace (by op and call index), the others run.
#include "dispatch_interceptor.h"
#include "draw_mask.h"
#include "engine/internal_ops.h"
#include "generator_effect.h"
#include "sac_state.h"

#include <recompose/checkpoint_error.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace recompose::detail {
namespace {

class CachedInterceptor final : public OpInterceptor {
 public:
  explicit CachedInterceptor(SacState& s) : s_(s) {}

  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const OpTraits& traits = OpTraits::of(op);
    if (traits.ignored || autocast_cacheable_cast(traits, op, *stack)) {
      run_below(op, stack);
      return;
    }
    OpCalls* calls = s_.trace.find_calls(op);
    const size_t index = calls == nullptr ? 0 : calls->rerun_seen++;
    if (calls == nullptr || index >= calls->nodes.size()) {
      throw CheckpointError(
          "recompose: selective checkpoint: " + op.schema().name() + " (call " +
          std::to_string(index) +
          " in the region) ran during the recomputation, but the forward of the region ran it " +
          std::to_string(calls == nullptr ? 0 : calls->nodes.size()) +
          " time(s). The region must run the same ops in the forward and in the recomputation; "
          "this "
          "happens when it is nondeterministic or depends on global state that changed between "
          "forward and backward.");
    }
    const uint32_t node = calls->nodes[index];
    KeptOutput* kept = node == OpCalls::kNoNode ? nullptr : s_.trace.kept_at(node);
    if (kept == nullptr) {  // recomputed: run, unless a kept output carries its write
      const KeptOutput* carrier = node == OpCalls::kNoNode ? nullptr : s_.trace.carrier_of(node);
      if (carrier != nullptr && !carrier->carrier_recomputed) {
        leave_written(op, traits, stack);
      } else {
        run_below(op, stack);
      }
      return;
    }
    if (kept->consumed) throw CheckpointError(extra_backward_error(op.schema().name()));
    if (kept->entry.carries_writes() && kept->entry.modified()) {
      // The program wrote into the kept output after the forward (it is the region's output
      // too): had the entry kept a copy, that write would not concern it. Run the op again, and
      // the writes it carried (they see carrier_recomputed).
      kept->carrier_recomputed = true;
      kept->consume();
      run_below(op, stack);
      return;
    }
    const size_t n_args = op.schema().arguments().size();
    if (stack->size() < n_args) internal_stack_error(op);
    // Check (may throw) before touching the stack.
    torch::jit::Stack kept_values;
    kept->entry.hand_out(op, static_cast<int64_t>(index), s_.allow_cache_entry_mutation,
                         &kept_values);
    if (kept->rng && !kept->rng->replay()) advance_generators(op, *stack);
    torch::jit::drop(*stack, n_args);
    for (c10::IValue& v : kept_values) stack->push_back(std::move(v));
    kept->consume();  // one replay per region: free the memory as backward goes
  }

 private:
  // A kept random op replayed from a generator state other than the forward's: run it on copies
  // of its arguments and drop the result, so the generators advance exactly as a recomputation
  // of the op would advance them (rewinding them to the forward's state instead would make
  // later draws repeat earlier ones). Costs the op once; only reached without preserved RNG state.
  static void advance_generators(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
    torch::jit::Stack rerun(stack.end() - n_args, stack.end());
    InternalOpsGuard internal;  // not the program's op: no interceptor may see it
    op.callBoxed(&rerun);
  }

  SacState& s_;
};

}  // namespace

std::unique_ptr<OpInterceptor> make_rerun_interceptor(SacState& state) {
  return std::make_unique<CachedInterceptor>(state);
}

}  // namespace recompose::detail
