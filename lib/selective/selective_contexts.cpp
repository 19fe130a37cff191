// create_selective_checkpoint_contexts: the forward context caches the outputs of saved ops,
// the recompute context replays them (upstream's _CachingTorchDispatchMode and
// _CachedTorchDispatchMode). Both are OpInterceptors sharing one OpLog per region invocation.
// The forward context also records a ForwardTrace, from which the contexts, as the region's
// SavedTensorReplay, rebuild the dropped saved tensors without running the forward again
// (docs/architecture.md, "Selective replay"); the recompute context serves the regions that
// cannot be replayed so.

#include "dispatch_interceptor.h"
#include "draw_mask.h"
#include "engine/enclosing_region.h"
#include "engine/format_bytes.h"
#include "engine/internal_ops.h"
#include "engine/saved_tensor_replay.h"
#include "forward_trace.h"
#include "generator_effect.h"
#include "replay_stats.h"

#include "op_log.h"
#include "op_traits.h"
#include "plugin/offload.h"
#include "policy_warnings.h"

#include <recompose/checkpoint_error.h>
#include <recompose/selective_checkpoint.h>

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace recompose {
namespace {

using detail::OpCalls;
using detail::OpSlot;

[[noreturn]] void internal_stack_error(const c10::OperatorHandle& op) {
  throw CheckpointError(
      "recompose: selective checkpoint: internal error: the stack of " + op.schema().name() +
      " holds fewer values than its arguments. Please report this with the model that "
      "triggers it.");
}

// Shared by the contexts object and every token entered from it: a token may outlive the
// contexts object (the engine drops it when the region ends).
struct SacState {
  SacState(SelectivePolicy p, bool allow)
      : policy(std::move(p)), allow_cache_entry_mutation(allow) {}
  const SelectivePolicy policy;
  const bool allow_cache_entry_mutation;
  detail::OpLog log;
  // Storages of the kept outputs of the forward -> their slots (forward thread only).
  std::unordered_multimap<const c10::StorageImpl*, std::pair<OpCalls*, size_t>> kept_storages;
  std::atomic<bool> forward_entered{false};
  // The region runs inside the forward of an enclosing full region: its forward keeps nothing.
  // See Note [ Kept outputs under an enclosing full region ].
  bool keeps_nothing_inside_full = false;
  std::atomic<bool> recompute_active{false};
  detail::ForwardTrace trace;
  bool replayed = false;      // a replay answered a recomputation (and released the kept outputs)
  std::string first_kept_op;  // the first op whose outputs the forward kept, if any
  // What the forward asked the policy, for the keeps-nothing warning: how many decisions, the
  // first op asked about, and a hash of the op names in order (the region's signature).
  int64_t decisions = 0;
  std::string first_decided_op;
  size_t op_signature = 0;
  // Device bytes of the kept outputs at capture (CacheEntry::bytes), for the holds-more warning.
  int64_t kept_device_bytes = 0;
  // Kept outputs an in-place op of the forward just wrote into, carried by their entries: their
  // versions are recorded anew at the next op or at the end of the forward, once autograd's
  // ADInplaceOrView layer (above the interceptor) has counted the write.
  std::vector<std::pair<OpCalls*, size_t>> carried_unversioned;
  void version_carried_writes() {
    for (auto [calls, index] : carried_unversioned) calls->slots[index].entry.accept_write();
    carried_unversioned.clear();
  }
  // Where MUST_SWAP outputs go (the process's default manager unless one was given).
  // (through the offload interface, provided by activation swap when it is built).
  std::shared_ptr<SwapManager> swap;
  std::shared_ptr<detail::Offloader> offloader_;
  detail::Offloader* offloader() {
    if (!offloader_) offloader_ = detail::make_offloader(swap);
    return offloader_.get();
  }
};

// A policy callable can return any int cast to CheckpointPolicy; acting on one would silently
// pick a branch.
void check_decision(CheckpointPolicy p, const c10::OperatorHandle& op, int64_t call_index) {
  switch (p) {
    case CheckpointPolicy::MUST_SAVE:
    case CheckpointPolicy::PREFER_SAVE:
    case CheckpointPolicy::MUST_RECOMPUTE:
    case CheckpointPolicy::PREFER_RECOMPUTE:
    case CheckpointPolicy::MUST_SWAP:
      return;
  }
  throw CheckpointError("recompose: selective checkpoint: the policy returned CheckpointPolicy(" +
                        std::to_string(static_cast<int64_t>(p)) + ") for " + op.schema().name() +
                        " (call " + std::to_string(call_index) +
                        " in the region), which is no CheckpointPolicy value: return "
                        "MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE, PREFER_RECOMPUTE or MUST_SWAP.");
}

std::string extra_backward_error(const std::string& op_name) {
  return "recompose: selective checkpoint: Trying to backward an extra time. You are only allowed "
         "to "
         "backward once on any region computed under selective activation checkpoint (the output "
         "of " +
         op_name +
         " saved in the forward was already used by an earlier "
         "recomputation, e.g. a backward with retain_graph).";
}

// A recomputation reaching a write that a kept output's entry carries: the value is in the
// entry already, so the op returns its argument as it is.
void leave_written(const c10::OperatorHandle& op, const detail::OpTraits& traits,
                   torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  if (stack->size() < n_args) internal_stack_error(op);
  const int32_t w = traits.inplace_argument;
  if (w < 0) internal_stack_error(op);  // not reached: carried only when there is one
  c10::IValue written = (*stack)[stack->size() - n_args + static_cast<size_t>(w)];
  torch::jit::drop(*stack, n_args);
  for (size_t r = 0; r < schema.returns().size(); ++r) stack->push_back(written);
}

bool keeps_output(CheckpointPolicy p) {
  // MUST_SWAP keeps the output too, offloaded to host memory (CacheEntry::capture).
  return p == CheckpointPolicy::MUST_SAVE || p == CheckpointPolicy::PREFER_SAVE ||
         p == CheckpointPolicy::MUST_SWAP;
}

class CachingInterceptor final : public detail::OpInterceptor {
 public:
  explicit CachingInterceptor(SacState& s) : s_(s) {}

  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const detail::OpTraits& traits = detail::OpTraits::of(op);
    if (traits.ignored) {
      detail::run_below(op, stack);
      return;
    }
    if (detail::autocast_cacheable_cast(traits, op, *stack)) {  // in the trace, never in the log
      s_.trace.begin(op, traits, *stack);
      detail::run_below(op, stack);
      s_.trace.end(*stack, nullptr, 0, nullptr);
      return;
    }
    if (!s_.carried_unversioned.empty()) s_.version_carried_writes();
    OpCalls& calls = s_.log.calls_of(op);
    const auto call_index = static_cast<int64_t>(calls.slots.size());
    if (traits.returns_alias) {
      if (traits.writes_argument) {
        // In place or out=: a new version of the storage it writes into (bernoulli_ of dropout
        // on CPU: with its generators' state).
        std::vector<CarriedWrite> carried;
        if (!s_.kept_storages.empty()) {
          protect_kept_outputs(op, traits, *stack, traits.carriable ? &carried : nullptr);
        }
        s_.trace.begin(op, traits, *stack);
        std::unique_ptr<detail::GeneratorEffect> rng;
        if (traits.random)
          rng = std::make_unique<detail::GeneratorEffect>(
              detail::GeneratorEffect::before(op, *stack));
        detail::run_below(op, stack);
        // Dropout's draw, kept as bits: the replay writes it back rather than drawing again.
        std::unique_ptr<detail::DrawMask> draw;
        if (rng && traits.draw && !stack->empty() && stack->back().isTensor()) {
          draw = detail::DrawMask::capture(stack->back().toTensor());
        }
        s_.trace.end(*stack, nullptr, 0, std::move(rng), std::move(draw));
        for (const CarriedWrite& c : carried) {
          s_.trace.carry_write(c.written);
          s_.carried_unversioned.emplace_back(c.calls, c.index);
        }
        OpSlot& writer = calls.slots.emplace_back();
        if (!carried.empty()) {  // one written argument: one carrier
          writer.carried_write = true;
          writer.carrier = carried.front().calls;
          writer.carrier_index = carried.front().index;
        }
      } else {
        detail::run_below(op, stack);  // a view: the trace names tensors by storage and layout
        calls.slots.emplace_back();
      }
      return;
    }
    if (!s_.kept_storages.empty()) protect_kept_outputs(op, traits, *stack, nullptr);
    const c10::FunctionSchema& schema = op.schema();
    const size_t n_args = schema.arguments().size();
    if (stack->size() < n_args) internal_stack_error(op);
    // The policy sees the arguments after the op ran (upstream passes the outputs too).
    torch::jit::Stack args(stack->end() - static_cast<std::ptrdiff_t>(n_args), stack->end());
    s_.trace.begin(op, traits, *stack);
    std::optional<detail::GeneratorEffect> rng;
    if (traits.random) rng = detail::GeneratorEffect::before(op, *stack);
    detail::run_below(op, stack);
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
    if (s_.decisions++ == 0) s_.first_decided_op = schema.name();
    s_.op_signature = s_.op_signature * 1000003u ^ std::hash<std::string>{}(schema.name());
    OpSlot& slot = calls.slots.emplace_back();
    if (keeps_output(decision)) {
      slot.kind = OpSlot::Kind::Saved;
      if (rng) {
        rng->after();
        slot.rng = std::make_unique<detail::GeneratorEffect>(std::move(*rng));
      }
      slot.entry = detail::CacheEntry::capture(
          ctx.outputs, decision == CheckpointPolicy::MUST_SWAP ? s_.offloader() : nullptr);
      s_.kept_device_bytes += slot.entry.bytes();
      for (const c10::StorageImpl* st : slot.entry.storages()) {
        s_.kept_storages.emplace(st, std::make_pair(&calls, calls.slots.size() - 1));
      }
      if (s_.first_kept_op.empty()) s_.first_kept_op = schema.name();
      s_.trace.end(*stack, &calls, static_cast<uint32_t>(calls.slots.size() - 1), nullptr);
    } else {
      s_.trace.end(*stack, nullptr, 0,
                   rng ? std::make_unique<detail::GeneratorEffect>(std::move(*rng)) : nullptr);
    }
  }

 private:
  // A kept output whose cache entry takes the value an in-place op is about to write.
  struct CarriedWrite {
    at::Tensor written;
    OpCalls* calls;  // the kept op's slot (an index: the op may add slots before it is carried)
    size_t index;
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
  void protect_kept_outputs(const c10::OperatorHandle& op, const detail::OpTraits& traits,
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
    std::vector<std::pair<OpCalls*, size_t>> slots;
    for (auto it = first; it != last; ++it) slots.push_back(it->second);
    if (carried != nullptr && slots.size() == 1) {
      auto [calls, index] = slots.front();
      OpSlot& slot = calls->slots[index];
      for (const CarriedWrite& c : *carried) {
        if (c.calls == calls && c.index == index) return;  // written twice: carried once
      }
      if (!slot.rng && !slot.entry.offloaded() &&
          s_.trace.kept_output_unread(written, calls, static_cast<uint32_t>(index))) {
        carried->push_back(CarriedWrite{written, calls, index});
        return;
      }
    }
    for (auto [calls, index] : slots) {
      OpSlot& slot = calls->slots[index];
      // Forget every storage of this entry, then keep copies (new storages, not registered:
      // nothing else writes into them).
      for (const c10::StorageImpl* st : slot.entry.storages()) {
        auto [b, e] = s_.kept_storages.equal_range(st);
        for (auto it = b; it != e;) {
          it = (it->second.first == calls && it->second.second == index)
                   ? s_.kept_storages.erase(it)
                   : std::next(it);
        }
      }
      slot.entry.copy_on_write();
    }
  }

  SacState& s_;
};

class CachedInterceptor final : public detail::OpInterceptor {
 public:
  explicit CachedInterceptor(SacState& s) : s_(s) {}

  void intercept(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const detail::OpTraits& traits = detail::OpTraits::of(op);
    if (traits.ignored || detail::autocast_cacheable_cast(traits, op, *stack)) {
      detail::run_below(op, stack);
      return;
    }
    OpCalls* calls = s_.log.find(op);
    const size_t index = calls == nullptr ? 0 : calls->replayed++;
    if (calls == nullptr || index >= calls->slots.size()) {
      throw CheckpointError(
          "recompose: selective checkpoint: " + op.schema().name() + " (call " +
          std::to_string(index) +
          " in the region) ran during the recomputation, but the forward of the region ran it " +
          std::to_string(calls == nullptr ? 0 : calls->slots.size()) +
          " time(s). The region must run the same ops in the forward and in the recomputation; "
          "this "
          "happens when it is nondeterministic or depends on global state that changed between "
          "forward and backward.");
    }
    OpSlot& slot = calls->slots[index];
    switch (slot.kind) {
      case OpSlot::Kind::Recompute:
        if (slot.carried_write && !slot.carrier->slots[slot.carrier_index].carrier_recomputed) {
          leave_written(op, traits, stack);
        } else {
          detail::run_below(op, stack);
        }
        return;
      case OpSlot::Kind::Consumed:
        throw CheckpointError(extra_backward_error(op.schema().name()));
      case OpSlot::Kind::Saved: {
        if (slot.entry.carries_writes() && slot.entry.modified()) {
          // The program wrote into the kept output after the forward (it is the region's output
          // too): had the entry kept a copy, that write would not concern it. Run the op again,
          // and the writes it carried (they see carrier_recomputed).
          slot.carrier_recomputed = true;
          slot.kind = OpSlot::Kind::Consumed;
          slot.entry.release();
          detail::run_below(op, stack);
          return;
        }
        const size_t n_args = op.schema().arguments().size();
        if (stack->size() < n_args) internal_stack_error(op);
        // Check (may throw) before touching the stack.
        torch::jit::Stack replayed;
        slot.entry.replay(op, static_cast<int64_t>(index), s_.allow_cache_entry_mutation,
                          &replayed);
        if (slot.rng && !slot.rng->replay()) advance_generators(op, *stack);
        torch::jit::drop(*stack, n_args);
        for (c10::IValue& v : replayed) stack->push_back(std::move(v));
        // One replay per region: free the memory as backward goes.
        slot.kind = OpSlot::Kind::Consumed;
        slot.entry.release();
        return;
      }
    }
  }

 private:
  // A kept random op replayed from a generator state other than the forward's: run it on copies
  // of its arguments and drop the result, so the generators advance exactly as a recomputation
  // of the op would advance them (rewinding them to the forward's state instead would make
  // later draws repeat earlier ones). Costs the op once; only reached without preserved RNG state.
  static void advance_generators(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    const auto n_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
    torch::jit::Stack rerun(stack.end() - n_args, stack.end());
    detail::InternalOpsGuard internal;  // not the program's op: no interceptor may see it
    op.callBoxed(&rerun);
  }

  SacState& s_;
};

// Two policies are likely mistakes: one that keeps nothing recomputes the whole region and
// intercepts every op (transformer_policy() on a CNN; measured against full checkpointing, the
// replay can still win: on the CPU GPT it wrote dropout's draws back and ran no module code), one
// that keeps more bytes than autograd saves
// holds more than no checkpointing (keeping the addmm outputs of a Linear + ReLU stack). Each is
// said once per kind of region (same op names in the same order: twin blocks warn once), for the
// first few kinds of a process, so that a randomized test does not flood its log.
struct PolicyWarnings {
  std::mutex mutex;
  std::unordered_set<size_t> warned;  // op signatures, salted by warning
};
PolicyWarnings& policy_warnings() {
  static PolicyWarnings w;
  return w;
}
thread_local bool policy_warnings_off = false;  // detail::PolicyWarningsOff

bool first_warning_of(size_t signature) {
  constexpr size_t kMostWarnings = 8;
  auto& w = policy_warnings();
  std::lock_guard lock(w.mutex);
  return w.warned.size() < kMostWarnings && w.warned.insert(signature).second;
}

// At the end of a region's forward, when every decision was made and every tensor saved.
void warn_about_policy(const SacState& s) {
  if (s.decisions == 0 || policy_warnings_off || s.keeps_nothing_inside_full) return;
  if (s.first_kept_op.empty()) {
    if (!first_warning_of(s.op_signature)) return;
    TORCH_WARN(
        "recompose: selective checkpoint: the policy kept no output of the ", s.decisions,
        " ops it was asked about in a region's forward (the first: ", s.first_decided_op,
        "), so the region is fully recomputed, and its forward pays for interception. If the "
        "policy was meant to keep some, name ops it runs (recompose::inspect_policy(policy, "
        "module, input) lists them); if not, compare the step with full checkpointing, which "
        "intercepts nothing (the replay that serves this region can still be the cheaper "
        "recomputation: it runs no module code and builds no autograd graph).");
    return;
  }
  const int64_t plain = s.trace.saved_bytes_from_ops();
  if (s.kept_device_bytes <= plain) return;
  if (!first_warning_of(s.op_signature ^ 0x9e3779b97f4a7c15ull)) return;
  TORCH_WARN(
      "recompose: selective checkpoint: the policy keeps ",
      detail::format_bytes(s.kept_device_bytes),
      " of op outputs in a region's forward (the first kept: ", s.first_kept_op,
      "), more than no checkpointing would hold there (", detail::format_bytes(plain),
      " saved by autograd): checkpointing this region costs memory. Keep fewer ops, ones whose "
      "outputs backward reads (recompose::inspect_policy(policy, module, input) shows what each op "
      "keeps), or do not checkpoint the region.");
}

// What enter_*() returns: the interceptor installed on this thread while it is alive.
template <class Interceptor>
struct Entered {
  explicit Entered(std::shared_ptr<SacState> s)
      : state(std::move(s)), interceptor(*state), scope(interceptor) {}
  ~Entered() {
    if constexpr (std::is_same_v<Interceptor, CachedInterceptor>)
      state->recompute_active.store(false);
    if constexpr (std::is_same_v<Interceptor, CachingInterceptor>) {
      state->version_carried_writes();
      warn_about_policy(*state);
    }
  }
  std::shared_ptr<SacState> state;
  Interceptor interceptor;
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
    detail::ReplayOutcome outcome;
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
    // As a recomputation would: the first kept output it reaches was handed out already.
    if (s.replayed && !s.first_kept_op.empty())
      throw CheckpointError(extra_backward_error(s.first_kept_op));
    // As a recomputation would, which replays every kept output: one modified in place since the
    // forward is an error even where the replay does not need it.
    bool carrier_modified = false;
    s.trace.for_each_kept([&](const c10::OperatorHandle& op, OpCalls& calls, uint32_t index) {
      const OpSlot& slot = calls.slots[index];
      if (slot.kind != OpSlot::Kind::Saved) return;
      if (slot.entry.carries_writes()) {
        carrier_modified = carrier_modified || slot.entry.modified();
      } else {
        slot.entry.check_unmodified(op, index, s.allow_cache_entry_mutation);
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
    bool handed_out = false;
    auto replay_kept = [&](const c10::OperatorHandle& op, OpCalls& calls, uint32_t index,
                           torch::jit::Stack* values) {
      OpSlot& slot = calls.slots[index];
      if (slot.kind != OpSlot::Kind::Saved)
        throw CheckpointError(extra_backward_error(op.schema().name()));
      const bool own = slot.entry.private_copies();  // released below: the replay's alone then
      slot.entry.replay(op, index, s.allow_cache_entry_mutation, values);
      // One replay per region, as one recomputation: free the kept outputs as backward goes.
      slot.kind = OpSlot::Kind::Consumed;
      slot.entry.release();
      handed_out = true;
      return own;
    };
    detail::ReplayOutcome outcome = s.trace.replay(inputs, rng_preserved, needed, replay_kept, out);
    s.trace.release_draws();  // one recomputation per region; a second backward draws again
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start);
    detail::count_replay(outcome, ns.count());
    if (!outcome.replayed && handed_out) {
      // Not reached in practice (what can fail is checked before a kept output is used), but
      // running the forward again would now find kept outputs gone: say so rather than fall back.
      throw CheckpointError(
          "recompose: selective checkpoint: the replay of a region gave up after using its kept "
          "outputs (" +
          outcome.fallback_reason +
          "). Please report this with the model that triggers it; "
          "recompose::set_selective_replay_enabled(false) works around it.");
    }
    if (!outcome.replayed) return false;
    s.replayed = true;
    s.log.release_kept();  // one replay per region, as one recomputation: free the kept outputs now
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
    return std::make_shared<Entered<CachingInterceptor>>(state_);
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
      state_->log.restart_replay();
      return std::make_shared<Entered<CachedInterceptor>>(state_);
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
PolicyWarningsOff::PolicyWarningsOff() : was_off_(policy_warnings_off) {
  policy_warnings_off = true;
}
PolicyWarningsOff::~PolicyWarningsOff() { policy_warnings_off = was_off_; }

void reset_policy_warnings() {
  auto& w = policy_warnings();
  std::lock_guard lock(w.mutex);
  w.warned.clear();
}
}  // namespace detail

}  // namespace recompose
