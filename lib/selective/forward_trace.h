// ForwardTrace: what a selective region's forward did below autograd, recorded so that backward
// can rebuild exactly the saved tensors it dropped, by running only their producing ops again
// (docs/architecture.md, "Selective replay"). A data type: the forward appends its records
// (trace_records.h) through the members below, which keep them consistent; what reads a forward
// is a free function over the trace: its summary (summarize, forward_summary.h), its replay plan
// (plan_replay, replay_plan.h) and the replay (rebuild_saved, replay_executor.h).
//
// Tensors are named by their storage and by how many recorded ops had written into it before
// (a version): every tensor the forward used (an op argument, a saved tensor) is a view of a
// storage that a recorded op created (or a region input, or a tensor from outside the region,
// such as a parameter) at some version. The replay runs, in forward order, the ops that produce
// the versions the saved tensors need, and the ops those need, from the kept outputs (answered
// by their cache entries), the region's inputs and the outside tensors; views are re-created
// with as_strided. Storages are held weakly: their memory is freed as usual, and their address
// is not reused while the trace lives.
#pragma once

#include "trace_records.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace recompose::detail {

class ForwardTrace {
 public:
  ForwardTrace() = default;
  ForwardTrace(ForwardTrace&&) = default;
  ForwardTrace& operator=(ForwardTrace&&) = default;
  // Leaves its sizes for the next trace to reserve.
  // See Note [ A trace reserves the last one's sizes ] (forward_trace.cpp).
  ~ForwardTrace();

  // Whether the trace records what only the replay reads (set before the forward; default on):
  // off (selective replay switched off at the region's entry), a random op's generator states,
  // kept draws and cheaper ops are not recorded, and a replay falls back. The record a forward
  // run again reads (kept outputs, calls per op, carried writes) is kept either way.
  void record_for_replay(bool on) { for_replay_ = on; }
  bool recorded_for_replay() const { return for_replay_; }

  // Whether the trace also records what only its summary reads (set before the forward; default
  // off): the views' calls, in order, and each op's output bytes.
  void record_summary(bool on) { summarizing_ = on; }
  bool records_summary() const { return summarizing_; }
  // For the summary only: node `node`, a draw kept as bits, took `seconds` on the host clock.
  void set_draw_seconds(uint32_t node, double seconds) { nodes_[node].draw_seconds = seconds; }
  // A call of a view op (OpCalls::kNoNode), numbered `call_index` among its op's calls, its
  // outputs on top of `stack`; recorded only for the summary.
  void view_call(const c10::OperatorHandle& op, int64_t call_index,
                 const torch::jit::Stack& stack) {
    if (summarizing_) {
      views_.push_back(TraceViewCall{static_cast<uint32_t>(nodes_.size()), op, call_index,
                                     output_bytes(stack, op.schema().returns().size())});
    }
  }

  // The region's inputs (before the body runs).
  void add_inputs(const std::vector<at::Tensor>& inputs);

  // Around one intercepted op that writes into an argument or returns new tensors: begin() with
  // its arguments on top of `stack`, end() with its outputs there. An op that throws between them
  // leaves the trace unusable (the region falls back).
  // `traits`: OpTraits::of(op), which the trace keeps (its writes_undeclared, cheaper_replay).
  void begin(const c10::OperatorHandle& op, const OpTraits& traits, const torch::jit::Stack& stack);
  // `kept`: what the forward kept of the op (its outputs are answered from it). `rng`: a random
  // op's generator states before it ran (not kept ones). `draw`: what an in-place draw wrote,
  // which the replay writes back instead of running the op (it keeps `rng` to draw again once
  // `draw` is freed).
  void end(const torch::jit::Stack& stack, std::unique_ptr<KeptOutput> kept,
           std::unique_ptr<GeneratorEffect> rng, std::unique_ptr<DrawMask> draw = nullptr);
  // The node begin() made last.
  uint32_t current_node() const { return static_cast<uint32_t>(nodes_.size() - 1); }
  // After end() of an autocast parameter cast (its output on top of `stack`): the cast is kept for
  // the replay until the forward ends (settle_kept_for_replay). Note [ Parameter casts kept for the
  // replay ] (parameter_casts.h).
  void keep_cast(const torch::jit::Stack& stack);
  // After end() of a native_dropout: its draw, from which the replay makes both outputs.
  void keep_dropout_draw(std::unique_ptr<DropoutDraw> draw);
  // At the end of the forward: releases the device masks of dropouts whose output the replay
  // reads, then keeps the casts autograd saved within `budget` (a fraction of
  // saved_bytes_from_ops, less the draws' bytes), smallest first, and releases the rest.
  KeptForReplay settle_kept_for_replay(double budget);

  // The forward's calls, per op (kept_output.h): a call of `op` was made, recorded as `node`
  // (OpCalls::kNoNode for a view). The forward registers each call once it returned.
  OpCalls& calls_of(const c10::OperatorHandle& op) { return calls_[op]; }
  // The write of node `writer` is carried by the kept output of node `carrier` (carry_write).
  void set_carrier(uint32_t writer, uint32_t carrier) { nodes_[writer].carrier = carrier; }

  // A forward run again (rerun_interceptor.cpp) finds the forward's calls here.
  // nullptr if the forward never ran `op`.
  OpCalls* find_calls(const c10::OperatorHandle& op);
  KeptOutput* kept_at(uint32_t node) const { return nodes_[node].kept.get(); }
  // The kept output that carries node's write, or nullptr.
  const KeptOutput* carrier_of(uint32_t node) const;
  // A new forward run again matches calls from the first one again.
  void restart_calls();
  // Consumes every kept output (after a replay, which uses them once).
  void release_kept();

  // Autograd saved `tensor` in the region's forward as saved tensor `index`.
  void saved(std::size_t index, const at::Tensor& tensor);

  // Whether the storage of `written` holds the output of a kept op that no recorded op has read
  // since that op (or since the last write carried into it): an op about to write into it may
  // then leave its cache entry holding the value after the write, with carry_write(), instead of
  // a copy of the value before (no copy in the forward, no write to run again in the replay).
  // `node` is the kept op's (the one that created the storage).
  bool kept_output_unread(const at::Tensor& written, uint32_t node) const;
  // The op recorded last (end() ran) wrote into the storage of `written`, whose kept output's
  // cache entry holds the value after that write: the replay takes that value for this version
  // of the storage, and never runs the write. Only after kept_output_unread() was true for it.
  void carry_write(const at::Tensor& written);

  // Frees the kept draws and casts (after the region's one recomputation): a later replay draws
  // and casts again.
  void release_draws();

  // Bytes of the storages created by the region's ops that autograd saved in its forward: what
  // the region would hold for backward without checkpointing, inputs and outside tensors apart.
  int64_t saved_bytes_from_ops() const { return saved_bytes_from_ops_; }

  // Calls f(op, kept) for every kept op, in forward order.
  void for_each_kept(const std::function<void(const c10::OperatorHandle&, KeptOutput&)>& f) const;

  // The records, as the forward left them (trace_records.h), for the functions that read a forward.
  const std::vector<TraceStorage>& storages() const { return storages_; }
  const std::vector<TraceNode>& nodes() const { return nodes_; }
  // The tensors autograd saved, in the order the replay hands them out (by position).
  const std::vector<TraceSaved>& saved_tensors() const { return saved_; }
  // The view calls, in order (recorded only for the summary).
  const std::vector<TraceViewCall>& view_calls() const { return views_; }
  // The forward's calls, per op.
  const std::unordered_map<c10::OperatorHandle, OpCalls>& calls() const { return calls_; }
  c10::ArrayRef<TraceArg> args_of(const TraceNode& node) const {
    return {args_.data() + node.first_arg, node.arg_count};
  }
  c10::ArrayRef<TensorUse> uses_of(const TraceNode& node) const {
    return {uses_.data() + node.first_use, node.use_count};
  }
  // The uses an op run again reads: a kept draw reads only the tensor it is written into.
  c10::ArrayRef<TensorUse> uses_read(const TraceNode& node) const;
  // Every op begun ended: none threw between begin() and end().
  bool ops_completed() const { return !poisoned_ && !pending_; }
  // Writes of the forward carried into kept outputs (carry_write).
  int64_t writes_carried() const { return writes_carried_; }

 private:
  // settle_kept_for_replay's first step: device masks kept only where the replay needs the mask
  // alone (Note [ Dropout's draw kept on every device ], dropout_draw.h).
  void release_masks_read_through();
  // The storages of the last n values on `stack`, each once (distinct_storage_bytes).
  static int64_t output_bytes(const torch::jit::Stack& stack, std::size_t n);

  TensorUse use_of(const at::Tensor& t);
  void fill_use(const at::Tensor& t, TensorUse& u);  // use_of, in place
  void add_use(const at::Tensor& t) { fill_use(t, uses_.emplace_back()); }
  uint32_t storage_of(const at::Tensor& t);  // registers an outside tensor on first sight
  uint32_t add_storage(const at::Tensor& t, TraceStorage::Source source);
  // At the first op: room for as many records as the last trace made.
  void reserve_like_last();

  std::vector<TraceStorage> storages_;
  // An open-addressing table: no allocation per storage, as a node-based map makes.
  ska::flat_hash_map<const c10::StorageImpl*, uint32_t> index_;
  std::vector<TraceNode> nodes_;
  std::vector<TraceArg> args_;   // every node's arguments (TraceNode::first_arg)
  std::vector<TensorUse> uses_;  // every node's tensor uses (TraceNode::first_use)
  std::vector<TraceSaved> saved_;
  std::unordered_map<c10::OperatorHandle, OpCalls> calls_;
  std::vector<TraceViewCall> views_;  // only while summarizing_
  int64_t saved_bytes_from_ops_ = 0;
  int64_t writes_carried_ = 0;
  bool for_replay_ = true;
  bool summarizing_ = false;
  bool pending_ = false;   // begin() without end()
  bool poisoned_ = false;  // an op threw between begin() and end()
};

}  // namespace recompose::detail
