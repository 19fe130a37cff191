// The forward interceptor of a selective region: runs each op, asks the policy, keeps the outputs
// of saved ops (copy-on-write or carrying the writes that follow), records the forward trace.
#include "dispatch_interceptor.h"
#include "draw_mask.h"
#include "dropout_draw.h"
#include "engine/internal_ops.h"
#include "generator_effect.h"
#include "sac_state.h"

#include <recompose/checkpoint_error.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace recompose::detail {
namespace {

class CachingInterceptor final : public OpInterceptor {
 public:
  explicit CachingInterceptor(SacState& s) : s_(s) {}

  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const OpTraits& traits = OpTraits::of(op);
    if (traits.ignored) {
      run_below(op, stack);
      return;
    }
    if (autocast_cacheable_cast(traits, op, *stack)) {  // a node, never one of its op's calls
      s_.trace.begin(op, traits, *stack);
      run_below(op, stack);
      s_.trace.end(*stack, nullptr, nullptr);
      // Kept for the replay, if the policy asks (settled when the forward ends).
      if (s_.policy.parameter_cast_budget() > 0 && !s_.keeps_nothing_inside_full)
        s_.trace.keep_cast(*stack);
      return;
    }
    if (!s_.carried_unversioned.empty()) s_.version_carried_writes();
    OpCalls& calls = s_.trace.calls_of(op);
    if (!traits.returns_alias) {
      run_and_decide(op, traits, stack, calls);
    } else if (traits.writes_argument) {
      run_write(op, traits, stack, calls);
    } else {
      run_below(op, stack);  // a view: the trace names tensors by storage and layout
      s_.trace.view_call(op, static_cast<int64_t>(calls.nodes.size()), *stack);
      calls.nodes.push_back(OpCalls::kNoNode);
    }
  }

 private:
  // In place or out=: a new version of the storage it writes into (bernoulli_ of dropout on CPU:
  // with its generators' state), possibly carried by the kept output it writes into.
  void run_write(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack,
                 OpCalls& calls) {
    std::vector<CarriedWrite> carried;
    if (!s_.kept_storages.empty()) {
      protect_kept_outputs(op, traits, *stack, traits.carriable ? &carried : nullptr);
    }
    s_.trace.begin(op, traits, *stack);
    const uint32_t node = s_.trace.current_node();
    // For the replay only: its rewinds, and dropout's draw kept as bits.
    const bool for_replay = traits.random && s_.trace.recorded_for_replay();
    std::unique_ptr<GeneratorEffect> rng;
    if (for_replay) rng = std::make_unique<GeneratorEffect>(GeneratorEffect::before(op, *stack));
    // A summary tells the planner what the draw took: the replay will not spend it.
    const bool timed = rng && traits.draw && s_.trace.records_summary();
    const auto start =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    run_below(op, stack);
    const double seconds =
        timed ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              : 0.0;
    // Dropout's draw, kept as bits: the replay writes it back rather than drawing again.
    std::unique_ptr<DrawMask> draw;
    if (rng && traits.draw && !stack->empty() && stack->back().isTensor()) {
      draw = DrawMask::capture(stack->back().toTensor());
    }
    const bool kept_draw = draw != nullptr;
    s_.trace.end(*stack, nullptr, std::move(rng), std::move(draw));
    if (timed && kept_draw) s_.trace.set_draw_seconds(node, seconds);
    for (const CarriedWrite& c : carried) {
      s_.trace.carry_write(c.written);
      s_.carried_unversioned.push_back(c.kept_node);
    }
    if (!carried.empty()) s_.trace.set_carrier(node, carried.front().kept_node);  // one argument
    calls.nodes.push_back(node);
  }

  // An op that returns new tensors: runs it, asks the policy, keeps its outputs or not.
  void run_and_decide(const c10::OperatorHandle& op, const OpTraits& traits,
                      torch::jit::Stack* stack, OpCalls& calls) {
    const auto call_index = static_cast<int64_t>(calls.nodes.size());
    if (!s_.kept_storages.empty()) protect_kept_outputs(op, traits, *stack, nullptr);
    const c10::FunctionSchema& schema = op.schema();
    const size_t n_args = schema.arguments().size();
    if (stack->size() < n_args) internal_stack_error(op);
    // The policy sees the arguments after the op ran (upstream passes the outputs too): copies,
    // in a stack reused from op to op (intercept() is never re-entered on one interceptor: the
    // policy's ops, and those below run_below, reach no interceptor or only outer ones).
    torch::jit::Stack& args = args_;
    args.assign(stack->end() - static_cast<std::ptrdiff_t>(n_args), stack->end());
    const ClearOnExit release_args{args};
    s_.trace.begin(op, traits, *stack);
    const uint32_t node = s_.trace.current_node();
    std::optional<GeneratorEffect> rng;
    if (traits.random) rng = GeneratorEffect::before(op, *stack);
    run_below(op, stack);
    const size_t n_out = schema.returns().size();
    SelectiveCheckpointContext ctx;
    ctx.outputs = c10::ArrayRef<c10::IValue>(stack->data() + (stack->size() - n_out), n_out);
    ctx.call_index = call_index;
    // The policy's own ops, if any, are seen by no interceptor (it runs inside intercept()).
    CheckpointPolicy decision = s_.policy(ctx, op, args);
    check_decision(decision, op, call_index);
    // An op that also writes into an argument (rrelu_with_noise's noise): its kept outputs cannot
    // stand in for the write a recomputation needs. See Note [ Early stop after the op's own
    // writes ].
    if (traits.writes_argument && keeps_output(decision))
      decision = CheckpointPolicy::PREFER_RECOMPUTE;
    if (s_.keeps_nothing_inside_full && keeps_output(decision))
      decision = CheckpointPolicy::PREFER_RECOMPUTE;
    s_.tally.asked(op, traits);
    if (s_.tally.collect_names) s_.tally.asked_ops.insert(op);
    calls.nodes.push_back(node);
    if (!keeps_output(decision)) {
      s_.trace.end(*stack, nullptr,
                   rng ? std::make_unique<GeneratorEffect>(std::move(*rng)) : nullptr);
      if (traits.native_dropout && s_.trace.recorded_for_replay()) keep_dropout_draw(args, *stack);
      return;
    }
    auto kept = std::make_unique<KeptOutput>();
    kept->call_index = call_index;
    if (rng) {
      rng->after();
      kept->rng = std::make_unique<GeneratorEffect>(std::move(*rng));
    }
    kept->entry = CacheEntry::capture(
        ctx.outputs, decision == CheckpointPolicy::MUST_SWAP ? s_.offloader() : nullptr);
    s_.tally.kept(schema.name(), kept->entry.bytes());
    for (const c10::StorageImpl* st : kept->entry.storages()) s_.kept_storages.emplace(st, node);
    s_.trace.end(*stack, std::move(kept), nullptr);
  }

  // native_dropout(input, p, train) ran with `args`; its (output, mask) on top of `stack`. See
  // Note [ Dropout's draw kept on every device ] (dropout_draw.h).
  void keep_dropout_draw(const torch::jit::Stack& args, const torch::jit::Stack& stack) {
    if (args.size() != 3 || !args[0].isTensor() || !args[1].isDouble() || stack.size() < 2 ||
        !stack.back().isTensor())
      return;
    auto draw = DropoutDraw::capture(args[0].toTensor(), args[1].toDouble(), args[2],
                                     stack.back().toTensor());
    if (draw) s_.trace.keep_dropout_draw(std::move(draw));
  }

  // A kept output whose cache entry takes the value an in-place op is about to write.
  struct CarriedWrite {
    at::Tensor written;
    uint32_t kept_node;  // the kept op's node in the trace
  };

  // An op about to write into the storage of a kept output (possibly through a TensorImpl with
  // its own version counter, as aten::_unsafe_view's output in a 3-d nn::Linear with bias). When
  // the op may be carried (`carried` given: in place into one argument, not random), nothing that
  // a recomputation runs has read the kept output since it was kept, and the output is held on
  // the device as the op returned it, the entry keeps the value after the write (sdpa's math path
  // adding the mask into bmm's output; a Linear's bias): no copy, and no write to run again in
  // the replay or in a recomputation that runs the forward again (leave_written). Otherwise the
  // entry keeps a copy of the value before the write, which the recomputation writes into rather
  // than into the forward's tensors.
  void protect_kept_outputs(const c10::OperatorHandle& op, const OpTraits& traits,
                            const torch::jit::Stack& stack, std::vector<CarriedWrite>* carried) {
    const size_t base = stack.size() - op.schema().arguments().size();
    for (const uint32_t i : traits.written_arguments) {
      const c10::IValue& v = stack[base + i];
      if (v.isTensor()) {
        protect_kept_in(v.toTensor(), carried);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) protect_kept_in(t, carried);
      }
    }
  }

  void protect_kept_in(const at::Tensor& written, std::vector<CarriedWrite>* carried) {
    if (!written.has_storage()) return;
    const c10::StorageImpl* storage = written.storage().unsafeGetStorageImpl();
    auto [first, last] = s_.kept_storages.equal_range(storage);
    c10::SmallVector<uint32_t, 2> nodes;
    for (auto it = first; it != last; ++it) nodes.push_back(it->second);
    if (carried != nullptr && nodes.size() == 1) {
      const uint32_t node = nodes.front();
      const KeptOutput& kept = *s_.trace.kept_at(node);
      for (const CarriedWrite& c : *carried) {
        if (c.kept_node == node) return;  // written twice: carried once
      }
      if (!kept.rng && !kept.entry.offloaded() && s_.trace.kept_output_unread(written, node)) {
        carried->push_back(CarriedWrite{written, node});
        return;
      }
    }
    for (const uint32_t node : nodes) {
      CacheEntry& entry = s_.trace.kept_at(node)->entry;
      // Forget every storage of this entry, then keep copies (new storages, not registered:
      // nothing else writes into them).
      for (const c10::StorageImpl* st : entry.storages()) {
        auto [b, e] = s_.kept_storages.equal_range(st);
        for (auto it = b; it != e;)
          it = it->second == node ? s_.kept_storages.erase(it) : std::next(it);
      }
      entry.copy_on_write();
    }
  }

  // Drops the policy's copies of the arguments once it decided (or threw).
  struct ClearOnExit {
    torch::jit::Stack& values;
    ~ClearOnExit() { values.clear(); }
  };

  SacState& s_;
  torch::jit::Stack args_;  // the policy's arguments (run_and_decide)
};

}  // namespace

std::unique_ptr<OpInterceptor> make_forward_interceptor(SacState& state) {
  return std::make_unique<CachingInterceptor>(state);
}

}  // namespace recompose::detail
