// ForwardTrace: what a selective region's forward did below autograd, recorded so that backward
// can rebuild exactly the saved tensors it dropped, by running only their producing ops again
// (docs/architecture.md, "Selective replay").
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

#include "batch_norm_replay.h"
#include "draw_mask.h"
#include "dropout_draw.h"
#include "events/replay_outcome.h"
#include "forward_summary.h"
#include "generator_effect.h"
#include "kept_output.h"
#include "op_traits.h"
#include "parameter_casts.h"
#include "replay_plan.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace recompose::detail {

// Where a tensor lies in its storage.
struct TensorGeometry {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  at::ScalarType dtype = at::kFloat;

  static TensorGeometry of(const at::Tensor& t);
  // Becomes t's geometry, in place (a geometry moved is copied element by element).
  void set(const at::Tensor& t);
  // Same sizes, strides and dtype (the storage offset apart).
  bool same_shape(const at::Tensor& t) const;
  bool operator==(const TensorGeometry& o) const {
    return offset == o.offset && dtype == o.dtype && sizes == o.sizes && strides == o.strides;
  }
};

// One use of a tensor in the forward.
struct TensorUse {
  static constexpr uint32_t kUndefined = UINT32_MAX;  // an undefined (optional) tensor
  static constexpr uint32_t kUnsupported =
      UINT32_MAX - 1;  // no strided storage, conjugate/negative bit
  uint32_t storage = kUndefined;
  uint32_t version = 0;  // recorded writes into the storage before this use
  TensorGeometry geometry;
};

class ForwardTrace {
 public:
  // Whether the trace records what only the replay reads (set before the forward; default on):
  // off (selective replay switched off at the region's entry), a random op's generator states,
  // kept draws and cheaper ops are not recorded, and a replay falls back. The record a forward
  // run again reads (kept outputs, calls per op, carried writes) is kept either way.
  void record_for_replay(bool on) { for_replay_ = on; }
  bool recorded_for_replay() const { return for_replay_; }

  // Whether the trace also records what only its summary reads (set before the forward; default
  // off): the views' calls, in order, and each op's output bytes.
  void record_summary(bool on) { summarizing_ = on; }
  // A call of a view op (OpCalls::kNoNode), numbered `call_index` among its op's calls, its
  // outputs on top of `stack`; recorded only for the summary.
  void view_call(const c10::OperatorHandle& op, int64_t call_index,
                 const torch::jit::Stack& stack) {
    if (summarizing_) {
      views_.push_back(ViewCall{static_cast<uint32_t>(nodes_.size()), op, call_index,
                                output_bytes(stack, op.schema().returns().size())});
    }
  }
  // The forward op by op (forward_summary.h), from what the trace recorded; complete only when
  // record_summary(true) was set before the forward (views and output bytes are missing else).
  ForwardSummary summary() const;

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

  // Rebuilds saved tensor i for each needed[i] into out[i] (see SavedTensorReplay::replay).
  // `replay_kept` hands a kept op's outputs (CacheEntry::hand_out, with the region's checks), once
  // per kept op the replay needs, in forward order, after every check that can be made up front.
  // It returns true when the tensors it hands are the replay's alone (CacheEntry::private_copies):
  // the replay then writes into them rather than into copies.
  // It plans (plan_replay), checks the inputs and outside tensors the plan reads, then runs the
  // plan (replay_executor.cpp). See Note [ The replay's contract ] (replay_plan.cpp).
  using ReplayKept =
      std::function<bool(const c10::OperatorHandle& op, KeptOutput& kept, torch::jit::Stack* out)>;
  events::ReplayOutcome replay(const std::vector<at::Tensor>& inputs, bool rng_preserved,
                               const std::vector<bool>& needed, const ReplayKept& replay_kept,
                               std::vector<at::Tensor>& out) const;

  // The replay that rebuilding saved tensor i for each needed[i] would run, or why the region
  // cannot be replayed (ReplayPlan::fallback). Runs nothing. Throws CheckpointError only for a
  // broken invariant of the trace (an internal error).
  ReplayPlan plan_replay(bool rng_preserved, const std::vector<bool>& needed) const;

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

 private:
  struct Storage {
    enum class Source : uint8_t { Op, Input, Outside };
    Source source = Source::Outside;
    const c10::StorageImpl* key = nullptr;
    c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
    uint32_t op = 0;      // Op: the node that created it
    uint32_t output = 0;  // Op: which of its (flattened) outputs
    uint32_t input = 0;   // Input: which region input
    at::Tensor outside;   // Outside: an alias of the tensor (shares its version counter)
    uint32_t outside_version = 0;
    TensorGeometry base;  // the creating output, the input, or the outside tensor
    std::vector<uint32_t>
        writers;         // node of each recorded write: version v is made by writers[v - 1]
    bool saved = false;  // autograd saved a tensor of it (counted in saved_bytes_from_ops_)
    // Since its value was last kept: an op a replay may run read it, or autograd saved it.
    bool read = false;
    // Op storages of a kept op: the version its cache entry holds (writes carried into it).
    uint32_t kept_version = 0;
  };
  struct Arg {
    // StandIn: a tensor the replay makes anew (a training batch norm's running statistic).
    enum class Kind : uint8_t { Constant, Tensor, TensorList, OptionalTensorList, StandIn };
    Kind kind = Kind::Constant;
    uint32_t first = 0;  // its node's uses [first, first + count)
    uint32_t count = 0;
    c10::IValue constant;
    std::unique_ptr<RunningStatStandIn> stand_in;  // StandIn
  };
  struct Node {
    Node(const c10::OperatorHandle& o, const OpTraits& t) : op(o), traits(&t) {}
    c10::OperatorHandle op;
    const OpTraits* traits;  // never freed (OpTraits::of)
    // Its arguments and the tensors they use, in the trace's args_ and uses_ (args_of, uses_of):
    // one array for every node, not two allocations per op.
    uint32_t first_arg = 0;
    uint32_t arg_count = 0;
    uint32_t first_use = 0;
    uint32_t use_count = 0;
    c10::SmallVector<uint32_t, 1> writes;  // storages written (one version each)
    c10::SmallVector<std::pair<uint32_t, uint32_t>, 2> created;  // (flattened output, storage)
    std::unique_ptr<KeptOutput> kept;                            // the forward kept its outputs
    uint32_t carrier = OpCalls::kNoNode;  // a write a kept output carries: that output's node
    std::unique_ptr<GeneratorEffect> rng;
    std::unique_ptr<DrawMask> draw;
    std::unique_ptr<DropoutDraw> dropout;  // native_dropout's draw (dropout_draw.h)
    std::unique_ptr<KeptCast> cast;        // an autocast parameter cast kept (parameter_casts.h)
    // A cheaper op the replay runs instead, with the same arguments (replay_substitute.h).
    std::optional<c10::OperatorHandle> replay_as;
    bool unsupported = false;    // an argument the replay cannot rebuild (tensors in a tuple...)
    bool hidden_writes = false;  // writes into arguments its schema does not declare
    bool complete = false;       // end() ran
    bool makes_values = false;   // returns a value of its own (Note in end())
    // For the summary only: the storages of its outputs, each once, with their bytes (created
    // ones and aliases of known ones).
    c10::SmallVector<uint32_t, 1> aliased;  // known storages its outputs alias
    int64_t output_bytes = 0;
  };
  struct ViewCall {
    uint32_t position;  // nodes recorded before it
    c10::OperatorHandle op;
    int64_t call_index;
    int64_t output_bytes;
  };
  // The storages of the last n values on `stack`, each once (distinct_storage_bytes).
  static int64_t output_bytes(const torch::jit::Stack& stack, std::size_t n);
  struct Saved {
    std::size_t index;
    uint32_t position;  // recorded ops before it was saved
    TensorUse use;
  };

  class Executor;  // one run of a ReplayPlan (replay_executor.cpp)

  c10::ArrayRef<Arg> args_of(const Node& node) const {
    return {args_.data() + node.first_arg, node.arg_count};
  }
  c10::ArrayRef<TensorUse> uses_of(const Node& node) const {
    return {uses_.data() + node.first_use, node.use_count};
  }

  // settle_kept_for_replay's first step: device masks kept only where the replay needs the mask
  // alone (Note [ Dropout's draw kept on every device ], dropout_draw.h).
  void release_masks_read_through();
  // plan_replay's steps (replay_plan.cpp); each returns why the region cannot be replayed, or "".
  c10::ArrayRef<TensorUse> uses_read(const Node& node) const;
  std::string mark_producer(const TensorUse& use, std::vector<char>& run) const;
  std::string why_not_runnable(const Node& node, bool rng_preserved) const;
  std::string mark_run_set(bool rng_preserved, const std::vector<bool>& needed,
                           std::vector<char>& run) const;
  std::string note_reads(const std::vector<bool>& needed, ReplayPlan& plan) const;
  // The region inputs and outside tensors the plan reads, as they are now.
  std::string check_sources(const ReplayPlan& plan, const std::vector<at::Tensor>& inputs) const;
  // summary()'s parts (forward_summary.cpp).
  void add_summary_reads(const TensorUse& use, const std::vector<uint32_t>& entry_of,
                         const std::vector<SummaryOp>& ops, std::vector<uint32_t>& out) const;
  std::vector<char> storages_carrying_writes() const;
  void add_write_reads(const std::vector<uint32_t>& entry_of, std::vector<SummaryOp>& ops) const;
  void note_writes_after(const std::vector<uint32_t>& entry_of, std::vector<SummaryOp>& ops) const;

  TensorUse use_of(const at::Tensor& t);
  void fill_use(const at::Tensor& t, TensorUse& u);  // use_of, in place
  void add_use(const at::Tensor& t) { fill_use(t, uses_.emplace_back()); }
  uint32_t storage_of(const at::Tensor& t);  // registers an outside tensor on first sight
  uint32_t add_storage(const at::Tensor& t, Storage::Source source);

  std::vector<Storage> storages_;
  // An open-addressing table: no allocation per storage, as a node-based map makes.
  ska::flat_hash_map<const c10::StorageImpl*, uint32_t> index_;
  std::vector<Node> nodes_;
  std::vector<Arg> args_;        // every node's arguments (Node::first_arg)
  std::vector<TensorUse> uses_;  // every node's tensor uses (Node::first_use)
  std::vector<Saved> saved_;
  std::unordered_map<c10::OperatorHandle, OpCalls> calls_;
  std::vector<ViewCall> views_;  // only while summarizing_
  int64_t saved_bytes_from_ops_ = 0;
  int64_t writes_carried_ = 0;
  bool for_replay_ = true;
  bool summarizing_ = false;
  bool pending_ = false;   // begin() without end()
  bool poisoned_ = false;  // an op threw between begin() and end()
};

}  // namespace recompose::detail
