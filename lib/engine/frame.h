// Frame: the state of one invocation of a checkpointed region, from its forward to the end of
// the last backward that needs it (PyTorch's _CheckpointFrame). It runs the recomputation (under
// a policy of its own that hands each recomputed tensor back to it) and checks it.
//
// Lifetimes (See Note [ Nestable Checkpoint ], rule 4): each tensor saved in the region's forward
// is replaced by a Holder of the frame; autograd's SavedVariable owns hooks that keep the frame
// alive and release their Holder when the SavedVariable goes (release_saved). A recomputation
// stores the recomputed tensor in the holders still alive, keyed by the graph task that asked;
// unpacking hands it out once and clears it, also with retain_graph.
#pragma once

#include "engine/holder.h"
#include "engine/module_state_snapshot.h"
#include "engine/region_inputs.h"
#include "engine/rng_state.h"
#include "engine/saved_tensor_replay.h"
#include "engine/tensor_meta.h"
#include "events/events.h"

#include <recompose/checkpoint_options.h>
#include <recompose/region_contexts.h>
#include <recompose/region_run.h>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace recompose::detail {

class Frame : public std::enable_shared_from_this<Frame> {
 public:
  Frame(RecomputeFn recompute, bool early_stop, DeterminismCheck check, bool debug);

  // Forward side.
  // Records a tensor saved in the forward; returns the index of its Holder.
  std::size_t record_saved(const at::Tensor& tensor);
  // The SavedVariable of Holder `index` is gone: its recomputed values are no longer needed.
  void release_saved(std::size_t index);
  void set_inputs(SavedRegionInputs inputs) { inputs_ = std::move(inputs); }
  void set_forward_state(ForwardState state) { forward_state_ = std::move(state); }
  const ForwardState& forward_state() const { return forward_state_; }
  // The region's contexts; when they can also replay the region's saved tensors
  // (SavedTensorReplay), the recomputation asks them first.
  void set_contexts(std::shared_ptr<RegionContexts> contexts) {
    contexts_ = std::move(contexts);
    replay_ = dynamic_cast<SavedTensorReplay*>(contexts_.get());
  }
  SavedTensorReplay* replay() const { return replay_; }
  // Another region began inside this one's forward: its saved tensors belong to that region's
  // frame, and only running this region's forward again rebuilds that frame's inputs as the
  // nesting rules want them; no replay.
  void mark_contains_region() { contains_region_ = true; }
  // Snapshots the module state of `roots` and `also` in place (see ModuleStateSnapshot); keeps
  // nothing when there is nothing to restore.
  void snapshot_module_state(const std::vector<std::shared_ptr<torch::nn::Module>>& roots,
                             const std::shared_ptr<torch::nn::Module>& also) {
    module_state_.emplace(roots, also);
    if (module_state_->empty()) module_state_.reset();
  }
  ModuleStateSnapshot* module_state() { return module_state_ ? &*module_state_ : nullptr; }
  // The body returned. If it ended with the op whose output it saved last, the recomputation
  // runs to its end: early stop would skip nothing and only pay for unwinding.
  void mark_forward_completed();
  // The forward initialised a device whose RNG state could not be stashed (see rng_state.h).
  void set_rng_problem(std::string device) { rng_problem_ = std::move(device); }
  // The ops of the forward (debug mode only; null otherwise).
  std::shared_ptr<std::vector<std::string>> forward_ops() { return forward_ops_; }
  bool debug() const { return debug_; }
  // The region's tag for the sinks of events that listened when it began: its rebuilds are
  // reported with it.
  void set_events_tag(events::Tag tag) { events_tag_ = std::move(tag); }
  const std::shared_ptr<RegionContexts>& contexts() const { return contexts_; }

  // Backward side: the tensor Holder `index` stands for, recomputing the region first if this
  // graph task has not yet done so.
  at::Tensor unpack(std::size_t index);

  // Recomputation side: called for each tensor saved during the recomputation. Throws
  // StopRecomputation when every tensor needed has been recomputed (early stop).
  void record_recomputed(int64_t graph_task, const at::Tensor& detached);

 private:
  void recompute(int64_t graph_task);
  // Rebuilds the saved tensors through replay_, if it can; false to run the forward again.
  bool replay_saved(int64_t graph_task, const std::vector<at::Tensor>& inputs);
  // recompute() once the inputs are unpacked: the replay, or the forward run again.
  void rebuild(int64_t graph_task, const std::vector<at::Tensor>& inputs,
               events::RebuildScope& rebuild_events);
  void check_recomputed_tensors_match(int64_t graph_task);
  [[noreturn]] void fail(const std::string& message);

  RecomputeFn recompute_fn_;
  SavedRegionInputs inputs_;
  // Per backward (graph task or group key) that recomputed the region. Few: a linear search.
  struct Recomputation {
    int64_t graph_task;
    std::size_t count = 0;  // tensors recomputed so far
    bool done = false;
  };
  Recomputation& recomputation(int64_t graph_task);

  // Inline capacity for small regions: the frame is one allocation, these add none.
  c10::SmallVector<Holder, 4> holders_;
  c10::SmallVector<TensorMeta, 4> metadata_;
  c10::SmallVector<Recomputation, 1> recomputations_;
  bool early_stop_;
  // Early stop as asked for; early_stop_ is off where it would skip nothing (a cost cut). Then
  // the recomputation runs on, and saves past the forward's count are dropped, as PyTorch,
  // stopping before them, never sees them.
  bool early_stop_asked_;
  // After the last tensor saved in the forward: the next autograd sequence number if that tensor
  // was the output of the newest node, else 0 (see mark_forward_completed).
  uint64_t sequence_after_last_output_ = 0;
  // The op that saved last saved an input that needs no gradient, before its kernel ran: the
  // kernel may write into it (rrelu_with_noise's noise). See
  // Note [ Early stop after the op's own writes ].
  bool last_saved_may_be_written_ = false;
  uint64_t next_node_at_last_save_ = 0;  // the autograd node counter at the last save
  DeterminismCheck check_;
  bool debug_;
  bool forward_completed_ = false;
  bool ignore_saved_mismatch_ = false;
  ForwardState forward_state_;
  std::string rng_problem_;
  std::shared_ptr<RegionContexts> contexts_;
  SavedTensorReplay* replay_ = nullptr;  // contexts_, when they replay
  bool contains_region_ = false;
  std::optional<ModuleStateSnapshot> module_state_;  // in place: no allocation of its own
  events::Tag events_tag_;                           // null unless a sink listened
  // Debug mode only (allocated by the constructor when debug is on).
  std::shared_ptr<std::vector<std::string>> forward_ops_;
  std::shared_ptr<std::vector<std::string>> recompute_ops_;
  std::recursive_mutex mutex_;
};

}  // namespace recompose::detail
