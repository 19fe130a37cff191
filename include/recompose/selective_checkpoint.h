// Selective activation checkpointing (SAC): a per-op policy decides which outputs of a
// checkpointed region are saved during the forward (and replayed during the recomputation) and
// which are recomputed.
//
//   // save matrix products, recompute the rest
//   recompose::apply_checkpoint(block, recompose::CheckpointOptions().policy(
//       recompose::SelectivePolicy({"aten::mm", "aten::addmm"})));
//   // or any callable
//   recompose::SelectivePolicy policy([](const recompose::SelectiveCheckpointContext& ctx,
//                                        const c10::OperatorHandle& op, const torch::jit::Stack&
//                                        args) {
//     return op.schema().name() == "aten::bmm" ? recompose::CheckpointPolicy::MUST_SAVE
//                                              : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
//   });
//   auto y = recompose::checkpoint(recompose::CheckpointOptions().context_fn([policy] {
//     return recompose::create_selective_checkpoint_contexts(policy);
//   }), fn, x);
//
// How it works (as torch.utils.checkpoint's _CachingTorchDispatchMode/_CachedTorchDispatchMode):
// ops are intercepted below autograd where a dispatch mode would see them, without one, so that
// composite ops decompose as without checkpointing (lib/selective/dispatch_interceptor.cpp). In the
// forward each op runs, then the policy is asked with its arguments and outputs; the outputs of
// saved ops are kept (detached, sharing their version counters). The decision is recorded per (op
// overload, call index). Backward rebuilds the dropped saved tensors by replaying only the ops that
// produce them, below autograd (selective replay, below), kept outputs answered from the cache.
// Where it cannot, the region's forward runs again and the policy is not asked again: an op
// recorded as saved returns its kept outputs without running, any other op runs. aten::detach and
// metadata ops (prim::device, aten::size, ...) are not seen by the policy. Ops whose outputs alias
// their inputs (views such as aten::t, in-place and out= ops) are always recomputed and not shown
// to the policy: recomputing a view costs nothing, keeping one would keep its base alive, and a
// kept in-place result would not modify the recomputed input. Under autocast, casts of float32
// parameters (leaves requiring grad) to bfloat16/float16 are always recomputed and not shown
// either: autocast caches them, so whether one runs depends on its cache, which differs between
// forward and recomputation.
//
// Random ops (tagged nondeterministic_seeded, or taking a Generator: rand_like, bernoulli,
// native_dropout, multinomial...) may be kept like any other. Their replay moves the generators
// as running them would: if every generator the op may draw from (its Generator arguments, the
// default generators of its devices, the CPU one always) is where the forward found it (the
// engine restores the region's RNG state, preserve_rng_state), it is set to where the forward
// left it (a copy of a few kilobytes of state per kept random op); otherwise the op runs again
// and its result is dropped, so later random ops draw what a full recomputation would draw.
//
// Ops that recompose runs for itself (copies of kept outputs, swap copies, a policy callable's
// own ops) are seen by no region's policy and counted in no region's op log.
#pragma once

#include <recompose/checkpoint_options.h>
#include <recompose/region_contexts.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace recompose {

/// What a policy decides for one op's outputs (PyTorch's CheckpointPolicy). In eager execution,
/// as in PyTorch's, the MUST_ and PREFER_ variants act the same.
enum class CheckpointPolicy {
  MUST_SAVE,         ///< keep the outputs on the device; the recomputation uses them
  PREFER_SAVE,       ///< as MUST_SAVE
  MUST_RECOMPUTE,    ///< drop the outputs; the recomputation runs the op again
  PREFER_RECOMPUTE,  ///< as MUST_RECOMPUTE (what every op not named gets)
  /// Keep the output, offloaded to host memory between forward and backward through a
  /// SwapManager (CheckpointOptions::swap_manager, else the default one; recompose/swap.h) and
  /// reloaded for the recomputation. Outputs the manager does not find eligible (below its size
  /// threshold, views that would free nothing) stay on the device as with MUST_SAVE. If the
  /// forward later writes into an offloaded output in place, the write waits for its copy to land
  /// first.
  MUST_SWAP,
};

/// What a policy may want to know about the op it decides for.
struct SelectiveCheckpointContext {
  /// Always false: the policy is only asked during the forward; the recomputation reuses the
  /// decisions recorded then (as upstream PyTorch now does, where is_recompute is deprecated).
  bool is_recompute = false;
  /// The op's outputs (the policy is asked after the op ran). Valid during the call only.
  c10::ArrayRef<c10::IValue> outputs;
  /// How many times this op overload ran before in this forward of the region (0 for its first
  /// call). Lets a policy decide by position, e.g. "every second aten::mm".
  int64_t call_index = 0;
};

/// The signature of a policy callable: the context, the op (its schema names it) and its
/// arguments, as the dispatcher passed them.
using PolicyFn =
    std::function<CheckpointPolicy(const SelectiveCheckpointContext& ctx,
                                   const c10::OperatorHandle& op, const torch::jit::Stack& args)>;

/// A selective checkpointing policy: a callable, or a list of ops to save. Given to
/// CheckpointOptions::policy or create_selective_checkpoint_contexts.
///
/// Example:
/// ```
/// recompose::SelectivePolicy save_mm({"aten::mm", "aten::addmm"});
/// recompose::SelectivePolicy by_size([](const recompose::SelectiveCheckpointContext& ctx,
///                                       const c10::OperatorHandle&, const torch::jit::Stack&) {
///   const bool big = !ctx.outputs.empty() && ctx.outputs[0].isTensor() &&
///                    ctx.outputs[0].toTensor().numel() > (1 << 20);
///   return big ? recompose::CheckpointPolicy::MUST_SAVE
///              : recompose::CheckpointPolicy::PREFER_RECOMPUTE;
/// });
/// recompose::apply_checkpoint(block, recompose::CheckpointOptions().policy(save_mm));
/// ```
class SelectivePolicy {
 public:
  /// Any callable. It is called on the thread running the region's forward, once per op; the
  /// ops it runs itself (e.g. to look at a tensor) are not seen by any region. Returning a value
  /// that is none of CheckpointPolicy's enumerators (CheckpointPolicy(42)) makes that op throw
  /// CheckpointError naming the op and the value.
  /// Throws std::invalid_argument if `fn` is empty.
  SelectivePolicy(
      PolicyFn fn);  // NOLINT(google-explicit-constructor): policies read better without a cast
  /// MUST_SAVE for the ops named, PREFER_RECOMPUTE for the rest. "aten::mm" names every overload
  /// of the op; "aten::max.dim" (or "aten::max.default" for the overload without a name) names
  /// one overload. Throws std::invalid_argument naming an op (or overload) that is not
  /// registered with the dispatcher, a name without a namespace ("mm"), or an op that is never
  /// kept (only in-place or out= overloads such as "aten::add_", "aten::mm.out"; detach and
  /// metadata ops such as "aten::size"): it would save nothing. Views ("aten::view", "aten::t")
  /// may be named, as in PyTorch; they are recomputed all the same (the values keeping them would
  /// give, without keeping their base alive).
  SelectivePolicy(const std::vector<std::string>& save_ops);  // NOLINT(google-explicit-constructor)
  /// As the vector overload: SelectivePolicy({"aten::mm", "aten::bmm"}).
  SelectivePolicy(
      std::initializer_list<const char*> save_ops);  // NOLINT(google-explicit-constructor)

  /// The decision for one op (calls the callable).
  CheckpointPolicy operator()(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                              const torch::jit::Stack& args) const {
    return fn_(ctx, op, args);
  }

  /// The op names of a save list, as given; empty for a policy made from a callable.
  /// inspect_policy reports those that no op of a region matched (PolicyReport::unmatched_names).
  const std::vector<std::string>& op_names() const { return op_names_; }

  /// Under autocast, keep the casts of parameters (aten::_to_copy of a float32 leaf that requires
  /// grad, to bfloat16 or float16: ops no policy is shown) that autograd saved in the region's
  /// forward, so that the replay takes them instead of casting again; smallest first, while they
  /// and the region's kept dropout draws hold at most `budget` times what the region would hold
  /// without checkpointing (0: keep none, the default for a policy you write; transformer_policy
  /// sets TransformerPolicyOptions::parameter_cast_budget). The rest are cast again in the replay.
  /// Throws std::invalid_argument for a negative or NaN budget.
  ///
  /// Example:
  /// ```
  /// auto policy = recompose::SelectivePolicy({"aten::mm"}).keep_parameter_casts(0.1);
  /// ```
  SelectivePolicy& keep_parameter_casts(double budget);
  /// The budget of keep_parameter_casts (0: none kept).
  double parameter_cast_budget() const { return parameter_cast_budget_; }

 private:
  PolicyFn fn_;
  std::vector<std::string> op_names_;
  double parameter_cast_budget_ = 0;
};

/// The forward/recompute context pair of one region invocation for `policy` (PyTorch's
/// create_selective_checkpoint_contexts); the engine calls it itself when CheckpointOptions has a
/// policy. Each call returns fresh contexts: enter the forward context once, then the recompute
/// context once per recomputation, on any thread. `allow_cache_entry_mutation`: see the first
/// error below. `swap_manager` receives the outputs of MUST_SWAP ops
/// (SwapManager::default_manager() if null).
///
/// Errors, thrown as CheckpointError by the op that hits them during the recomputation:
///  - a saved output was modified in place between the forward and the recomputation (unless
///    allow_cache_entry_mutation is true; then the modified values are used);
///  - a second recomputation needs a saved output that the first already handed out
///    ("Trying to backward an extra time", e.g. backward twice with retain_graph);
///  - the recomputation runs an op (or more calls of an op) that the forward did not run (when the
///    region's forward runs again; a replay runs no module code);
///  - the policy returned a value that is no CheckpointPolicy (thrown in the forward).
/// Entering the forward context twice, or the recompute context while it is already entered, is
/// a CheckpointError too.
///
/// Example:
/// ```
/// auto contexts = recompose::create_selective_checkpoint_contexts({"aten::mm"});
/// { auto fwd = contexts->enter_forward(); y = torch::relu(torch::mm(a, b)); }   // mm kept
/// { auto rec = contexts->enter_recompute(); torch::relu(torch::mm(a, b)); }     // mm replayed
/// ```
std::shared_ptr<RegionContexts> create_selective_checkpoint_contexts(
    const SelectivePolicy& policy, bool allow_cache_entry_mutation = false,
    std::shared_ptr<SwapManager> swap_manager = nullptr);

/// Bytes of the op outputs that selective checkpointing keeps for backward right now, in this
/// process (all regions, all threads): the sizes of their storages, each storage once per kept
/// op output. A SavedTensorMeter alive on the forward thread counts them too. Kept outputs are
/// released as the recomputation replays them, and when the region's autograd graph is freed.
///
/// Example:
/// ```
/// auto loss = model(x).sum();
/// int64_t kept = recompose::selective_checkpoint_bytes_kept();
/// ```
int64_t selective_checkpoint_bytes_kept();

/// Selective replay. In the forward, a selective region records, below autograd, every op that
/// creates a tensor or writes into one, and which of them made each tensor autograd saves. When
/// backward first needs the region, it rebuilds the saved tensors the policy dropped by running
/// again only the ops that produce them (and the ops those need), from the kept outputs and the
/// region's inputs: no module code, no autograd graph, nothing for ops whose outputs nobody saved.
/// Random ops draw with their generators where the forward found them; the generators end where
/// backward found them. A region it cannot replay so recomputes as before (its forward runs again
/// under the recompute context), counted here with the reason: a region that contains another
/// region, debug(true), an op it needs that writes into a tensor from outside the region (e.g.
/// cuDNN's batch norm's running statistics; native_batch_norm replays without them), a random op it
/// needs under preserve_rng_state(false), a parameter modified in place since the forward, views it
/// cannot re-create (another dtype, conjugate bits), a backward inside the region's forward.
/// Gradients are the same either way.
///
/// Example:
/// ```
/// auto stats = recompose::selective_replay_stats();
/// if (stats.fallbacks > 0) std::cerr << "not replayed: " << stats.last_fallback_reason << "\n";
/// ```
struct SelectiveReplayStats {
  int64_t replayed = 0;     ///< recomputations of selective regions answered by a replay
  int64_t fallbacks = 0;    ///< recomputations that ran the region's forward again instead
  int64_t ops_run = 0;      ///< ops the replays ran
  int64_t ops_skipped = 0;  ///< recorded ops (not kept) the replays did not need
  /// Of ops_run: ops run as a cheaper op that gives the same bits for what the forward saw
  /// (_safe_softmax as softmax where no row was fully masked, on CPU).
  int64_t ops_substituted = 0;
  /// Random ops the replays did not run: what they drew in the forward, kept as one bit per
  /// element, written back (dropout's bernoulli_ on CPU), or native_dropout's outputs made from
  /// its kept draw (bits on CPU, the bool mask on CUDA) without drawing again.
  int64_t draws_written = 0;
  /// Autocast's casts of parameters the replays did not run: the forward's casts, kept for them
  /// (SelectivePolicy::keep_parameter_casts; transformer_policy keeps them within its budget).
  int64_t casts_kept = 0;
  /// In-place writes of the forward into kept outputs that the kept outputs carried (they hold
  /// the value after the write: no copy in the forward, no write in the replay), in the regions
  /// replayed.
  int64_t writes_carried = 0;
  int64_t replay_ns = 0;  ///< host time in the replays, ...
  /// ... of which in the ops they ran (the host time of the ops recomputed)
  int64_t op_ns = 0;
  std::string last_fallback_reason;  ///< why the last fallback could not replay
};

/// The counters of this process (all regions, all threads) since the start or the last reset.
/// Does not run anything; thread-safe.
///
/// Example:
/// ```
/// recompose::reset_selective_replay_stats();
/// loss.backward();
/// auto stats = recompose::selective_replay_stats();   // stats.fallbacks == 0: all replayed
/// ```
SelectiveReplayStats selective_replay_stats();
/// Sets the counters of this process to zero (see selective_replay_stats).
void reset_selective_replay_stats();

/// Turns selective replay on (the default) or off for the whole process: off, every selective
/// region recomputes by running its forward again (counted as fallbacks). For comparisons, and
/// for regions the replay cannot see (docs/architecture.md, "What the trace cannot see"). A region
/// whose forward ran with the replay off records nothing that only a replay reads (dropout's draws
/// as bits, the generators' states, cheaper ops), so it runs its forward again also if the replay
/// is turned on before its backward.
///
/// Example:
/// ```
/// recompose::set_selective_replay_enabled(false);   // compare against the forward run again
/// ```
void set_selective_replay_enabled(bool enabled);
/// Whether selective replay is on (set_selective_replay_enabled; true unless turned off).
bool selective_replay_enabled();

/// Options of `transformer_policy`.
///
/// Example:
/// ```
/// auto policy = recompose::transformer_policy(
///     recompose::TransformerPolicyOptions().recompute_every_second_mm(true));
/// ```
struct TransformerPolicyOptions {
  /// Recompute every second aten::mm of a region invocation (its 2nd, 4th, ... call) instead of
  /// saving all of them (torchtitan's "op" SAC option). Other matrix products are not counted.
  /// Default: false
  TORCH_ARG(bool, recompute_every_second_mm) = false;
  /// Under autocast, the region keeps autocast's casts of parameters for the replay (which then
  /// casts no parameter again) while they and its kept dropout draws hold at most this fraction of
  /// what the region would hold without checkpointing (SelectivePolicy::keep_parameter_casts;
  /// docs/guide/selective.md, "What transformer_policy keeps"). 0 keeps none, as torchtitan's
  /// _save_list, which never sees the casts. Default: 0.065
  TORCH_ARG(double, parameter_cast_budget) = 0.065;
};

/// A ready policy for transformer blocks, like torchtitan's: MUST_SAVE for compute-intensive ops
/// (aten::mm, addmm, bmm, linear, _scaled_mm, the scaled-dot-product attention kernels (flash,
/// efficient, cudnn, flash for CPU), the full max reduction aten::max.default and
/// _c10d_functional::reduce_scatter_tensor), PREFER_RECOMPUTE for the rest. Ops of the list
/// that this LibTorch does not register are left out. `options`: see TransformerPolicyOptions.
/// Beyond torchtitan's _save_list, the region keeps for its replay (whatever the policy):
/// dropout's draws (bits on CPU; on CUDA native_dropout's bool mask, where the replay needs the
/// mask alone), and under autocast the casts of parameters within `parameter_cast_budget` (0.065
/// of what the region would hold without checkpointing, less the draws), so that the replay
/// draws and casts less.
///
/// Example:
/// ```
/// recompose::apply_checkpoint(
///     block, recompose::CheckpointOptions().policy(recompose::transformer_policy(
///                recompose::TransformerPolicyOptions().recompute_every_second_mm(true))));
/// ```
SelectivePolicy transformer_policy(TransformerPolicyOptions options = {});

}  // namespace recompose
